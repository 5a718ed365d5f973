"""QueuedPrompts compiled (accounting/_queued.c) against the Python class (accounting/queued.py)
on edge inputs: times as ints, NaN and inf, ties, prompts dispatched at the same instant,
prompt counts of every type, tiny blocks; and the ways the compiled one must not crash the
accounting child (an object never initialised, a block size that overflows, an allocation
that fails while a block splits). The crash cases run in a subprocess."""

from __future__ import annotations

import dataclasses
import math
import os
import random
import struct
import subprocess
import sys
import textwrap

import pytest

from accounting import queued
from accounting.queued import PlacesPrompts, QueuedPrompts, queued_prompts
from core.records import RequestRecord
from tests.accounting.test_queued_prompts import fcfs

try:
    from accounting._queued import QueuedPrompts as Compiled
except ImportError:  # pragma: no cover - a build without a C compiler
    Compiled = None  # type: ignore[assignment,misc]

pytestmark = pytest.mark.skipif(Compiled is None, reason="accounting/_queued.c was not built")

CONSTS = ("chunk_tokens=8192.0, min_chunk_step_s=0.02, queued_steps=0.25, memory_s=1e9, "
          "same_step_s=0.003, mismatch_steps=1.0, look_back=64")


def _bits(chunks: list[tuple[float, float, float]] | None) -> list[bytes] | None:
    return None if chunks is None else [struct.pack("<3d", *c) for c in chunks]


def _outcome(places: PlacesPrompts, rec: RequestRecord, rate: float) -> tuple[str, object]:
    try:
        return "ok", _bits(places.place(rec, rate))
    except Exception as e:  # any exception: the two must raise the same type
        return "raised", type(e)


def _base() -> RequestRecord:
    return fcfs([20_000], 0.02, 1e-5)[0][0]


def _weird_time(rnd: random.Random) -> float:
    return rnd.choice([rnd.uniform(0, 40), float(rnd.randint(0, 40)), rnd.randint(0, 40),
                       math.nan, math.inf, -math.inf, 0.0, -0.0])


@pytest.mark.parametrize("block", [1, 2, 3, 512])
def test_edge_values_bit_for_bit(monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    """Ties of first tokens, prompts dispatched at the same instant, int/NaN/inf times,
    prompts of 0, 1, negative, fractional and chunk-multiple tokens, rates of 0, < 0, NaN,
    inf: the same chunks or the same exception, record after record."""
    monkeypatch.setattr(queued, "BLOCK", block)
    rnd, base = random.Random(block), _base()
    compared = 0
    for _ in range(25):
        py, c = QueuedPrompts(), queued_prompts()
        firsts: list[float] = []
        disps: list[float] = []
        for j in range(rnd.randint(1, 200)):
            weird = rnd.random() < 0.05
            d = _weird_time(rnd) if weird else rnd.uniform(0, 100)
            if disps and rnd.random() < 0.2:
                d = rnd.choice(disps)  # dispatched at the same instant
            f = _weird_time(rnd) if weird else d + rnd.choice(
                [0.0, 0.001, rnd.uniform(0, 3), rnd.uniform(0, 0.01)])
            if firsts and rnd.random() < 0.3:
                f = rnd.choice(firsts)  # the same first token
            firsts.append(f)
            disps.append(d)
            rec = dataclasses.replace(
                base, request_id=str(j), dispatched_s=d, first_token_s=f, arrived_s=0.0,
                arrived_wall_s=rnd.choice([1000.0, 1000.5, 0.0, 1000]),
                engine=rnd.choice(["a", "b", 7]),  # type: ignore[arg-type]  # not a str too
                prompt_tokens=rnd.choice([rnd.randint(1, 60_000), 8192, 16_384, 1, 0, -5,  # type: ignore[arg-type]  # a float too
                                          3.5, True, 10**7]),
                step_from_s=rnd.choice([None, f - rnd.uniform(0, 1), f - 0.02, f - 0.001,
                                        _weird_time(rnd) if weird else None]))
            rate = rnd.choice([0.0, 40_000.0, rnd.uniform(1e3, 1e6), -1.0]
                              + ([math.nan, math.inf, 1e-320] if weird else []))
            assert _outcome(py, rec, rate) == _outcome(c, rec, rate), (j, rec, rate)
            compared += 1
    assert compared > 500


def test_state_after_an_exception() -> None:
    """A record that cannot be placed (a prompt count no float holds) raises in both before
    either remembers anything: the next record gets the same predecessor in both."""
    base = _base()
    a = dataclasses.replace(base, request_id="a", dispatched_s=0.0, first_token_s=10.0,
                            step_from_s=9.9, prompt_tokens=100)
    bad = dataclasses.replace(base, request_id="x", dispatched_s=100.0, first_token_s=101.0,
                              prompt_tokens=10**400)
    b = dataclasses.replace(base, request_id="b", dispatched_s=9.0, first_token_s=12.0,
                            step_from_s=11.0, prompt_tokens=30_000)
    py, c = QueuedPrompts(), queued_prompts()
    for rec in (a, bad, b):
        assert _outcome(py, rec, 40_000.0) == _outcome(c, rec, 40_000.0), rec.request_id


def test_int_times_give_the_same_types() -> None:
    """Times given as ints (msgspec decodes float fields as floats, so only direct callers
    give them): both hand back floats, the same values."""
    base = _base()
    recs = [dataclasses.replace(base, request_id=str(i), dispatched_s=i, first_token_s=5 + i,
                                arrived_s=0, arrived_wall_s=1000, step_from_s=4 + i,
                                prompt_tokens=30_000) for i in range(2)]
    py, c = QueuedPrompts(), queued_prompts()
    for rec in recs:
        want, got = py.place(rec, 40_000.0), c.place(rec, 40_000.0)
        assert _bits(want) == _bits(got)
        if want is not None and got is not None:
            assert [tuple(map(type, w)) for w in want] == [tuple(map(type, g)) for g in got]


def _survives(code: str, *, env_malloc: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if env_malloc:
        env["PYTHONMALLOC"] = env_malloc
    script = textwrap.dedent("""
        import dataclasses
        from accounting._queued import QueuedPrompts as C
        from tests.accounting.test_queued_prompts import fcfs
        rec = fcfs([20000], 0.02, 1e-5)[0][0]
    """) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env=env, check=False)


def test_an_uninitialised_object_raises_not_segfaults() -> None:
    """An object made without __init__ raises on place(), it does not crash the process."""
    r = _survives("""
        o = C.__new__(C)
        try:
            o.place(rec, 40000.0)
        except Exception:
            pass
        print("survived")
    """)
    assert r.returncode == 0 and "survived" in r.stdout, (r.returncode, r.stderr[-500:])


def test_a_block_too_large_is_refused() -> None:
    """A block size whose 2 * block + 1 entries overflow Py_ssize_t is refused, not
    allocated small and written past."""
    r = _survives(f"""
        try:
            o = C({CONSTS}, block=2**62)
            for i in range(10):
                o.place(dataclasses.replace(rec, first_token_s=rec.first_token_s + i), 4e4)
        except (ValueError, OverflowError, MemoryError):
            pass
        print("survived")
    """)
    assert r.returncode == 0 and "survived" in r.stdout, (r.returncode, r.stderr[-500:])


def test_a_failed_split_leaves_no_block_over_capacity() -> None:
    """Where the allocation for a block's split fails, nothing was inserted: the block never
    goes over its capacity (PYTHONMALLOC=debug would report the overwritten pad bytes and
    abort)."""
    pytest.importorskip("_testcapi")
    r = _survives(f"""
        import _testcapi
        o = C({CONSTS}, block=2)
        recs = [dataclasses.replace(rec, first_token_s=rec.first_token_s + i) for i in range(8)]
        for r in recs[:4]:
            o.place(r, 40000.0)
        rate = 40000.0
        _testcapi.set_nomemory(0)
        try:
            o.place(recs[4], rate)
        except MemoryError:
            pass
        finally:
            _testcapi.remove_mem_hooks()
        o.place(recs[5], rate)
        del o
        print("survived")
    """, env_malloc="debug")
    assert r.returncode == 0 and "survived" in r.stdout, (r.returncode, r.stderr[-500:])
