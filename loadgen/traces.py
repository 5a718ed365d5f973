"""Trace replay: read public trace formats into (offset, lengths) rows; scale, de-quantise, merge.

Formats (docs/loadgen.md, "Trace replay"):
- azure: CSV `TIMESTAMP,ContextTokens,GeneratedTokens` (AzurePublicDataset LLM inference).
- burstgpt: CSV `Timestamp,...,Request tokens,Response tokens,...` (seconds from start).
- mooncake: JSONL `{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}`.

Time scaling divides every offset by `speedup`, so gap ratios (the burst structure, the gap CV)
are unchanged. Bucketed timestamps (Mooncake's ~3 s buckets) replayed as-is send each bucket as
one burst; de-quantisation spreads the rows of a bucket uniformly (seeded) over the bucket.
`sample_rows` writes small synthetic traces in each format from our own generator.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import orjson

FORMATS: tuple[str, ...] = ("azure", "burstgpt", "mooncake")


@dataclass(frozen=True, slots=True)
class TraceRow:
    offset_s: float
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()  # Mooncake 512-token prefix blocks, for shared prefixes
    tenant: str = ""


def _parse_azure_ts(text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    # Azure writes 7 fractional digits; datetime takes at most 6.
    if "." in text:
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    return datetime.fromisoformat(text).timestamp()


def _rebase(rows: list[TraceRow]) -> list[TraceRow]:
    rows.sort(key=lambda r: r.offset_s)
    if not rows:
        return rows
    t0 = rows[0].offset_s
    return [replace(r, offset_s=r.offset_s - t0) for r in rows]


def parse_azure(text: str) -> list[TraceRow]:
    rows = []
    for rec in csv.DictReader(io.StringIO(text)):
        rows.append(TraceRow(_parse_azure_ts(rec["TIMESTAMP"]), int(rec["ContextTokens"]),
                             int(rec["GeneratedTokens"])))
    return _rebase(rows)


def parse_burstgpt(text: str, *, include_failures: bool = False) -> list[TraceRow]:
    rows = []
    for rec in csv.DictReader(io.StringIO(text)):
        out = int(float(rec["Response tokens"]))
        if out == 0 and not include_failures:
            continue  # BurstGPT logs failed calls with zero response tokens
        rows.append(TraceRow(float(rec["Timestamp"]), int(float(rec["Request tokens"])), out))
    return _rebase(rows)


def parse_mooncake(text: str) -> list[TraceRow]:
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        rec = orjson.loads(line)
        rows.append(TraceRow(float(rec["timestamp"]) / 1000.0, int(rec["input_length"]),
                             int(rec["output_length"]), tuple(int(h) for h in rec.get("hash_ids", ()))))
    return _rebase(rows)


PARSERS: dict[str, Callable[[str], list[TraceRow]]] = {
    "azure": parse_azure,
    "burstgpt": parse_burstgpt,
    "mooncake": parse_mooncake,
}


def load(path: Path, fmt: str) -> list[TraceRow]:
    if fmt not in PARSERS:
        raise ValueError(f"unknown trace format {fmt!r}; allowed: {', '.join(FORMATS)}")
    return PARSERS[fmt](path.read_text())


def detect_bucket_s(rows: Sequence[TraceRow]) -> float:
    """The timestamp bucket width when many rows share a timestamp, else 0.

    Taken as the smallest gap between distinct timestamps, used only when over 20% of gaps are 0.
    """
    gaps = [b.offset_s - a.offset_s for a, b in itertools.pairwise(rows)]
    if not gaps or sum(1 for g in gaps if g == 0) < 0.2 * len(gaps):
        return 0.0
    positive = [g for g in gaps if g > 0]
    return min(positive) if positive else 0.0


def dequantize(rows: Sequence[TraceRow], bucket_s: float, rng: random.Random) -> list[TraceRow]:
    """Spread the rows of each timestamp bucket uniformly over [t, t + bucket_s)."""
    if bucket_s <= 0:
        return list(rows)
    groups: dict[float, list[TraceRow]] = defaultdict(list)
    for r in rows:
        groups[r.offset_s].append(r)
    out: list[TraceRow] = []
    for t, group in groups.items():
        jitters = sorted(rng.uniform(0.0, bucket_s) for _ in group)
        out.extend(replace(r, offset_s=t + j) for r, j in zip(group, jitters, strict=True))
    out.sort(key=lambda r: r.offset_s)
    return out


def scale_time(rows: Iterable[TraceRow], speedup: float) -> list[TraceRow]:
    """Replay `speedup` times faster (offsets / speedup); gap ratios are unchanged."""
    return [replace(r, offset_s=r.offset_s / speedup) for r in rows]


def window(rows: Sequence[TraceRow], start_s: float, duration_s: float) -> list[TraceRow]:
    """Rows in [start_s, start_s + duration_s), re-based to start at 0."""
    return [replace(r, offset_s=r.offset_s - start_s) for r in rows
            if start_s <= r.offset_s < start_s + duration_s]


def superpose(traces: Sequence[tuple[str, Sequence[TraceRow]]]) -> list[TraceRow]:
    """Merge several traces into one stream, each row labelled with its tenant."""
    merged = [replace(r, tenant=name) for name, rows in traces for r in rows]
    merged.sort(key=lambda r: (r.offset_s, r.tenant))
    return merged


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """How to replay one trace file."""

    path: Path
    fmt: str
    tenant: str = ""
    speedup: float = 1.0
    dequantize_s: float | None = None  # None: detect; 0: off
    start_s: float = 0.0
    duration_s: float = math.inf


def prepare(spec: TraceSpec, rng: random.Random) -> list[TraceRow]:
    rows = load(spec.path, spec.fmt)
    bucket = detect_bucket_s(rows) if spec.dequantize_s is None else spec.dequantize_s
    rows = dequantize(rows, bucket, rng)
    rows = window(rows, spec.start_s, spec.duration_s)
    rows = scale_time(rows, spec.speedup)
    return [replace(r, tenant=spec.tenant) for r in rows]


# --- sample traces (our own generator; no downloads) ---------------------------------------


def _sample(n: int, seed: int, *, burstiness: float, rate_rps: float, median_in: int,
            median_out: int) -> list[tuple[float, int, int]]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.gammavariate(burstiness, 1.0 / (rate_rps * burstiness))
        p = max(1, int(rng.lognormvariate(math.log(median_in), 0.8)))
        o = max(1, int(rng.lognormvariate(math.log(median_out), 0.9)))
        out.append((t, p, o))
    return out


def sample_text(fmt: str, n: int = 200, seed: int = 0) -> str:
    """A small synthetic trace in `fmt`, shaped like the public ones (bursty arrivals,
    lognormal lengths)."""
    if fmt == "azure":
        base = datetime(2023, 11, 16, 18, 0, 0).timestamp()
        lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
        for t, p, o in _sample(n, seed, burstiness=0.2, rate_rps=2.6, median_in=1469, median_out=13):
            stamp = datetime.fromtimestamp(base + t).strftime("%Y-%m-%d %H:%M:%S.%f") + "0"
            lines.append(f"{stamp},{p},{o}")
        return "\n".join(lines) + "\n"
    if fmt == "burstgpt":
        lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
        for t, p, o in _sample(n, seed, burstiness=0.5, rate_rps=1.0, median_in=600, median_out=200):
            lines.append(f"{t:.3f},ChatGPT,{p},{o},{p + o},Conversation log")
        return "\n".join(lines) + "\n"
    if fmt == "mooncake":
        rng = random.Random(seed + 1)
        lines = []
        next_block = 0
        prefixes: list[list[int]] = []
        for t, p, o in _sample(n, seed, burstiness=1.0, rate_rps=5.5, median_in=1020, median_out=129):
            blocks = max(1, math.ceil(p / 512))
            # Half the requests continue a known prefix.
            reuse = bool(prefixes) and rng.random() < 0.5
            ids = list(rng.choice(prefixes))[:blocks] if reuse else []
            while len(ids) < blocks:
                ids.append(next_block)
                next_block += 1
            prefixes.append(ids)
            ms = int(t // 3.0) * 3000  # ~3 s timestamp buckets, as in the public trace
            lines.append(orjson.dumps({"timestamp": ms, "input_length": p, "output_length": o,
                                       "hash_ids": ids}).decode())
        return "\n".join(lines) + "\n"
    raise ValueError(f"unknown trace format {fmt!r}; allowed: {', '.join(FORMATS)}")


def synthetic_rows(n: int, seed: int, *, rate_rps: float, burstiness: float, median_in: int,
                   median_out: int) -> list[TraceRow]:
    """`n` rows of our own generator (gamma inter-arrivals of shape `burstiness`: CV =
    1/sqrt(shape); lognormal lengths around the given medians), seeded."""
    return [TraceRow(t, p, o) for t, p, o in _sample(n, seed, burstiness=burstiness,
                                                     rate_rps=rate_rps, median_in=median_in,
                                                     median_out=median_out)]


def azure_text(rows: Iterable[TraceRow]) -> str:
    """`rows` written as an Azure LLM-inference CSV (`parse_azure` reads it back; offsets to
    the microsecond)."""
    base = datetime(2023, 11, 16, 18, 0, 0).timestamp()
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for r in rows:
        stamp = datetime.fromtimestamp(base + r.offset_s).strftime("%Y-%m-%d %H:%M:%S.%f")
        lines.append(f"{stamp}0,{r.prompt_tokens},{r.output_tokens}")
    return "\n".join(lines) + "\n"
