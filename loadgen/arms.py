"""Arms of a precision comparison: one engine kind at one precision each.

Through the gateway, `model@fp8` goes to any FP8 endpoint of the model, whatever its engine
kind: with vLLM FP8 and TensorRT-LLM FP8 in one pool, one "fp8" arm would measure a mix of two
engines. The gateway lists its endpoints (`GET /admin/v1/endpoints`, admin key); a precision
served by one engine kind stays one arm through the gateway, labelled by both ("fp8 (vllm)").
A precision served by several kinds is split into one arm per endpoint, sent to that engine
directly (the gateway has no per-endpoint pin), labelled "fp8 (trtllm, h100-trt-fp8)": its
energy is then the simulator's ground truth when the engine is simulated, else not measured.
Without the listing (no admin key, or the target is an engine) the kind is "unchecked". An arm
named with `--arm-target PREC=URL` is that one engine, labelled by its precision.

Each arm carries its output quality (core/quality.py): the lowest its endpoints state in the
gateway's listing, else the published figure for its precision, unless `--quality` gives one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from core.quality import Quality, published
from loadgen.client import Target

UNCHECKED = "unchecked"


@dataclass(frozen=True, slots=True)
class Arm:
    label: str
    precision: str
    engine_kind: str  # the gateway endpoint's kind, "direct" for --arm-target, or "unchecked"
    target: Target
    note: str = ""  # why this arm is what it is (a split, a direct target)
    quality: Quality | None = None  # None: not known (a precision with no published figure)


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    url: str
    kind: str
    precision: str
    quality: Quality | None = None


def _quality(raw: Any, precision: str) -> Quality | None:
    if not isinstance(raw, Mapping):
        return published(precision)
    return Quality(float(raw["score"]), str(raw.get("benchmark", "")),
                   str(raw.get("source", "")))


def endpoints_of(doc: Mapping[str, Any], model: str) -> list[Endpoint]:
    """The model's endpoints from a `/admin/v1/endpoints` answer."""
    return [Endpoint(str(e["name"]), str(e["url"]), str(e["kind"]), str(e["precision"]),
                     _quality(e.get("quality"), str(e["precision"])))
            for e in doc.get("endpoints", []) if e.get("model") == model]


def lowest(endpoints: Sequence[Endpoint], precision: str) -> Quality | None:
    """The lowest quality the endpoints state (an arm is as good as its worst engine)."""
    known = [e.quality for e in endpoints if e.quality is not None]
    return min(known, key=lambda q: q.score) if known else published(precision)


def with_quality(arms: Sequence[Arm], given: Mapping[str, float]) -> list[Arm]:
    """Arms with `--quality PRECISION=SCORE` in place of the listed or published figure."""
    return [replace(a, quality=Quality(given[a.precision], "user-supplied", "--quality"))
            if a.precision in given else a for a in arms]


async def fetch_endpoints(base_url: str, admin_key: str, model: str) -> list[Endpoint] | None:
    """The gateway's endpoints of `model`, or None when it does not list them (no admin key,
    an engine rather than a gateway, or an error)."""
    if not admin_key:
        return None
    timeout = aiohttp.ClientTimeout(total=5)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(
                f"{base_url.rstrip('/')}/admin/v1/endpoints",
                headers={"Authorization": f"Bearer {admin_key}"}) as resp:
            if resp.status != 200:
                return None
            return endpoints_of(await resp.json(), model)
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
        return None  # not a wattgate gateway: the arms stay unchecked


def plan_arms(precisions: Sequence[str], gateway: Mapping[str, Target],
              direct: Mapping[str, Target], endpoints: Sequence[Endpoint] | None
              ) -> list[Arm]:
    """One arm per (engine kind, precision). `gateway`: precision -> its target through the
    gateway; `direct`: precision -> an engine named with --arm-target."""
    arms: list[Arm] = []
    for prec in precisions:
        if prec in direct:
            arms.append(Arm(prec, prec, "direct", direct[prec],
                            f"sent to {direct[prec].base_url} (--arm-target)", published(prec)))
            continue
        mine = [e for e in endpoints or () if e.precision == prec]
        kinds = sorted({e.kind for e in mine})
        if endpoints is None or not mine:
            arms.append(Arm(prec, prec, UNCHECKED, gateway[prec],
                            "engine kind not checked (the gateway's endpoint list needs "
                            "--admin-key)" if endpoints is None else
                            "the gateway lists no endpoint at this precision", published(prec)))
        elif len(kinds) == 1:
            arms.append(Arm(f"{prec} ({kinds[0]})", prec, kinds[0], gateway[prec],
                            quality=lowest(mine, prec)))
        else:
            base = gateway[prec]
            for e in sorted(mine, key=lambda e: (e.kind, e.name)):
                arms.append(Arm(f"{prec} ({e.kind}, {e.name})", prec, e.kind,
                                Target(e.url, base.model.split("@")[0], base.api),
                                f"{prec} is served by {' and '.join(kinds)} engines: split "
                                f"into one arm per engine, this one sent to {e.url} directly; "
                                "its energy is the engine's own (a simulator's ground truth), "
                                "not the gateway's apportioned accounting of the other arms",
                                lowest([e], prec)))
    return arms
