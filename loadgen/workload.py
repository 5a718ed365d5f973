"""Workloads: who sends what, when. `build_plan` turns a Workload into the run's exact requests.

A plan is pure data and depends only on the workload (seed included): the same workload gives
the same intended times, tenants, prompts and output lengths, so a run can be replayed against
several targets (precisions) as paired arms.

Multi-tenant mixes: a tenant either takes a `share` of the run's arrival process (each arrival is
assigned to a tenant with probability share / total; splitting a Poisson stream this way gives
Poisson streams) or brings its own `arrival` process, superposed on the others. Traces bring their
own arrivals and lengths; their rows are labelled with the trace's tenant.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from core.vocab import SloClass
from loadgen import arrivals, lengths, traces
from loadgen.lengths import LengthDist
from loadgen.prompts import Draft, PromptSynth, WordPrompts, from_spec

APIS: tuple[str, ...] = ("chat", "completions")


@dataclass(frozen=True, slots=True)
class TenantSpec:
    name: str
    api_key: str = ""
    share: float = 1.0
    arrival: arrivals.ArrivalProcess | None = None  # None: a share of the run's arrivals
    prompt_tokens: LengthDist = field(default_factory=lambda: lengths.fixed(128))
    output_tokens: LengthDist = field(default_factory=lambda: lengths.fixed(64))
    slo_class: str = "default"
    conversations: tuple[tuple[str, int], ...] = ()  # ShareGPT pool: (prompt, output tokens)
    headers: tuple[tuple[str, str], ...] = ()  # extra request headers (e.g. x-sim-fault)


@dataclass(frozen=True, slots=True)
class Workload:
    model: str
    tenants: tuple[TenantSpec, ...]
    arrival: arrivals.ArrivalProcess | None
    duration_s: float = 60.0
    max_requests: int = 1_000_000
    seed: int = 0
    api: str = "chat"
    slo_classes: tuple[SloClass, ...] = (SloClass("default", ttft_s=0.5, tpot_s=0.05),)
    traces: tuple[traces.TraceSpec, ...] = ()
    # What a prompt length counts: a tokenizer's tokens, or words (the simulated engine's count).
    prompts: PromptSynth = field(default_factory=WordPrompts)

    @property
    def concurrency(self) -> int | None:
        """Closed-loop concurrency, or None for an open-loop schedule."""
        return self.arrival.concurrency if isinstance(self.arrival, arrivals.Closed) else None

    def slo(self, name: str) -> SloClass:
        for s in self.slo_classes:
            if s.name == name:
                return s
        return SloClass(name)


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    index: int
    intended_s: float  # offset from the run's start
    tenant: str
    api_key: str
    slo_class: str
    prompt: str
    prompt_tokens: int  # the target the prompt was synthesised for
    max_tokens: int
    headers: tuple[tuple[str, str], ...] = ()


def _tenant_stream(w: Workload) -> list[tuple[float, TenantSpec]]:
    """(intended offset, tenant) for every open-loop or closed-loop arrival."""
    out: list[tuple[float, TenantSpec]] = []
    shared = [t for t in w.tenants if t.arrival is None]
    if w.arrival is not None and shared:
        times = w.arrival.offsets_s(random.Random(f"{w.seed}:arrival"), w.duration_s,
                                    w.max_requests)
        assign = random.Random(f"{w.seed}:assign")
        weights = [t.share for t in shared]
        for t in times:
            out.append((t, shared[0] if len(shared) == 1 else
                        assign.choices(shared, weights)[0]))
    for tenant in w.tenants:
        if tenant.arrival is not None:
            rng = random.Random(f"{w.seed}:arrival:{tenant.name}")
            out.extend((t, tenant) for t in tenant.arrival.offsets_s(rng, w.duration_s,
                                                                     w.max_requests))
    out.sort(key=lambda p: p[0])  # stable: equal times keep tenant order
    return out


def build_plan(w: Workload) -> tuple[PlannedRequest, ...]:
    chat = w.api == "chat"
    synth = w.prompts
    by_name = {t.name: t for t in w.tenants}
    content_rng = {t.name: random.Random(f"{w.seed}:content:{t.name}") for t in w.tenants}
    # (offset, tenant, fixed prompt text or a draft, target prompt tokens, output tokens)
    rows: list[tuple[float, TenantSpec, str | Draft, int, int]] = []

    if w.traces:
        trace_rows = traces.superpose([(s.tenant, traces.prepare(s, random.Random(
            f"{w.seed}:trace:{i}"))) for i, s in enumerate(w.traces)])
        default = w.tenants[0] if w.tenants else TenantSpec("default")
        for row in trace_rows[: w.max_requests]:
            tenant = by_name.get(row.tenant, default)
            rng = content_rng.setdefault(tenant.name, random.Random(f"{w.seed}:content:{tenant.name}"))
            draft = (synth.block_draft(row.hash_ids, row.prompt_tokens, chat) if row.hash_ids
                     else synth.draft(rng, row.prompt_tokens, chat))
            rows.append((row.offset_s, tenant, draft, row.prompt_tokens, row.output_tokens))
    else:
        for t_s, tenant in _tenant_stream(w)[: w.max_requests]:
            rng = content_rng[tenant.name]
            if tenant.conversations:
                text, out_tokens = tenant.conversations[rng.randrange(len(tenant.conversations))]
                rows.append((t_s, tenant, text, synth.count(text, chat), out_tokens))
            else:
                p_tokens = tenant.prompt_tokens.sample(rng)
                out_tokens = tenant.output_tokens.sample(rng)  # drawn before the prompt's words
                rows.append((t_s, tenant, synth.draft(rng, p_tokens, chat), p_tokens,
                             out_tokens))
    return _planned(rows, synth.finish([r[2] for r in rows if not isinstance(r[2], str)],
                                       f"{w.seed}:prompts"))


def _planned(rows: Sequence[tuple[float, TenantSpec, str | Draft, int, int]],
             texts: Sequence[str]) -> tuple[PlannedRequest, ...]:
    """The plan, with each draft replaced by its finished text (in order)."""
    finished = iter(texts)
    return tuple(
        PlannedRequest(i, t_s, tenant.name, tenant.api_key, tenant.slo_class,
                       prompt if isinstance(prompt, str) else next(finished), p_tokens,
                       out_tokens, tenant.headers)
        for i, (t_s, tenant, prompt, p_tokens, out_tokens) in enumerate(rows))


def requested_rate_rps(w: Workload, plan: Sequence[PlannedRequest]) -> float:
    """The offered rate: the processes' mean rate, or the plan's own count / span for traces."""
    if w.traces or (w.arrival is None and not any(t.arrival for t in w.tenants)):
        span = plan[-1].intended_s - plan[0].intended_s if len(plan) > 1 else 0.0
        return (len(plan) - 1) / span if span > 0 else math.inf
    rate = w.arrival.mean_rate_rps if w.arrival is not None and any(
        t.arrival is None for t in w.tenants) else 0.0
    rate += sum(t.arrival.mean_rate_rps for t in w.tenants if t.arrival is not None)
    return rate


# --- files ---------------------------------------------------------------------------------


def load_sharegpt(path: Path, limit: int = 100_000) -> tuple[tuple[str, int], ...]:
    """(first human turn, word count of the reply) pairs from a ShareGPT-format JSON file."""
    data = orjson.loads(path.read_bytes())
    out: list[tuple[str, int]] = []
    for item in data:
        conv = item.get("conversations") or item.get("conversation") or []
        if len(conv) < 2:
            continue
        prompt, reply = conv[0].get("value", ""), conv[1].get("value", "")
        if prompt.strip() and reply.strip():
            out.append((prompt, max(1, len(reply.split()))))
        if len(out) >= limit:
            break
    if not out:
        raise ValueError(f"{path}: no usable conversations (need a human turn then a reply)")
    return tuple(out)


def _slo_classes(spec: Mapping[str, Any]) -> tuple[SloClass, ...]:
    out = []
    for name, lim in spec.items():
        out.append(SloClass(str(name), ttft_s=lim.get("ttft_s"), tpot_s=lim.get("tpot_s"),
                            e2e_s=lim.get("e2e_s")))
    return tuple(out)


def _lengths(spec: Any, base: Path, which: str) -> LengthDist:
    """A length distribution; `{kind: empirical, trace: FILE, format: FMT}` takes the trace's
    prompt or output lengths (which = "prompt" | "output")."""
    if isinstance(spec, Mapping) and spec.get("kind") == "empirical" and "trace" in spec:
        rows = traces.load(base / str(spec["trace"]), str(spec.get("format", "azure")))
        values = [r.prompt_tokens if which == "prompt" else r.output_tokens for r in rows]
        return lengths.empirical(values)
    return lengths.from_spec(spec)


def _tenant(spec: Mapping[str, Any], base: Path, default_slo: str) -> TenantSpec:
    conv: tuple[tuple[str, int], ...] = ()
    if "sharegpt" in spec:
        conv = load_sharegpt(base / str(spec["sharegpt"]))
    return TenantSpec(
        name=str(spec["name"]), api_key=str(spec.get("api_key", "")),
        share=float(spec.get("share", 1.0)),
        arrival=arrivals.from_spec(spec["arrival"]) if "arrival" in spec else None,
        prompt_tokens=_lengths(spec.get("prompt_tokens", 128), base, "prompt"),
        output_tokens=_lengths(spec.get("output_tokens", 64), base, "output"),
        slo_class=str(spec.get("slo_class", default_slo)), conversations=conv,
        headers=tuple((str(k), str(v)) for k, v in spec.get("headers", {}).items()))


def from_mapping(data: Mapping[str, Any], base: Path = Path()) -> Workload:
    """A workload from its YAML mapping; relative file paths resolve against `base`."""
    slos = _slo_classes(data.get("slo_classes", {"default": {"ttft_s": 0.5, "tpot_s": 0.05}}))
    default_slo = str(data.get("default_slo_class", slos[0].name))
    tenants = tuple(_tenant(t, base, default_slo) for t in data.get("tenants", [{"name": "default"}]))
    trace_specs = tuple(
        traces.TraceSpec(path=base / str(t["path"]), fmt=str(t["format"]),
                         tenant=str(t.get("tenant", tenants[0].name)),
                         speedup=float(t.get("speedup", 1.0)),
                         dequantize_s=(None if t.get("dequantize_s", "auto") == "auto"
                                       else float(t["dequantize_s"])),
                         start_s=float(t.get("start_s", 0.0)),
                         duration_s=float(t.get("duration_s", math.inf)))
        for t in data.get("traces", []))
    tokenizer = data.get("tokenizer")
    api = str(data.get("api", "chat"))
    if api not in APIS:
        raise ValueError(f"api: {api!r} not allowed; allowed: {', '.join(APIS)}")
    return Workload(
        model=str(data["model"]), tenants=tenants,
        arrival=arrivals.from_spec(data["arrival"]) if "arrival" in data else None,
        duration_s=float(data.get("duration_s", 60.0)),
        max_requests=int(data.get("max_requests", 1_000_000)), seed=int(data.get("seed", 0)),
        api=api, slo_classes=slos, traces=trace_specs,
        prompts=_prompt_synth(str(tokenizer), base) if tokenizer else WordPrompts())


def _prompt_synth(spec: str, base: Path) -> PromptSynth:
    """`tokenizer:` of a workload file: a path relative to the file when one is there, else
    as given (an absolute path, a hub name, or "words")."""
    beside = base / spec
    return from_spec(str(beside) if beside.exists() else spec)


def load_workload(path: Path) -> Workload:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return from_mapping(data, path.parent)
