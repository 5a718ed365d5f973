"""The service's static split follows the Shapley rule of the engine's steps: the static power
over the steps' fixed part by the steps each request was in, the rest by token work."""

from __future__ import annotations

import math

import pytest

from accounting.apportion import apportion_by
from accounting.coefficients import DEFAULTS
from accounting.prefill import CHUNK_TOKENS
from accounting.work import WorkRow

BF16 = DEFAULTS["bf16"]  # no delta_1: every step's weight reads cost delta
IDLE_W = 75.0


def test_a_decoder_beside_a_long_prefill_pays_its_steps_fixed_part_not_half_the_static() -> None:
    """Two requests resident all interval: a 20,000-token prompt and a decoder of 50 tokens.
    By residency each pays half the static power; by the steps' Shapley rule the decoder pays
    its share of the steps' fixed part (weights read, host work) and the prompt the static
    power over its compute time."""
    rows = [WorkRow("prompt", 0, 20000.0, 1.0, 1.0, 0.0, 0.0),
            WorkRow("decoder", 0, 0.0, 50.0, 1.0, 0.0, 25000.0)]
    a = apportion_by(600.0, 1.0, IDLE_W, rows, BF16)
    got = {s.request_id: s for s in a.shares}
    # By hand: both spans cover the interval, so each sequence is in its steps with half a
    # step's weight: the prompt in 1 + 20000/8192 steps, the decoder in 50.
    steps = {"prompt": 0.5 * (1.0 + 20000.0 / CHUNK_TOKENS), "decoder": 0.5 * 50.0}
    fixed_j = IDLE_W * sum(steps.values()) * BF16.step_s
    # A prompt chunk's per-sequence work (beta - alpha each), as a decoded token carries.
    own = {"prompt": (BF16.alpha * 20000.0 + BF16.beta * 1.0
                      + (BF16.beta - BF16.alpha) * 20000.0 / CHUNK_TOKENS),
           "decoder": BF16.beta * 50.0 + BF16.gamma * 25000.0}
    for rid in steps:
        want = (fixed_j * steps[rid] / sum(steps.values())
                + (IDLE_W - fixed_j) * own[rid] / sum(own.values()))
        assert got[rid].static_j == pytest.approx(want, rel=1e-12)
    assert got["decoder"].static_j < 0.5 * (IDLE_W / 2.0)  # residency would give it 37.5 J
    assert math.fsum(s.energy_j for s in a.shares) + a.idle_j == pytest.approx(600.0, rel=1e-12)


def test_sequences_in_the_same_steps_share_the_fixed_part_equally() -> None:
    """Two decoders in the same steps, one reading a ten times longer context: the same fixed
    part each, the longer one more of the rest."""
    rows = [WorkRow("short", 0, 0.0, 40.0, 1.0, 0.0, 4000.0),
            WorkRow("long", 0, 0.0, 40.0, 1.0, 0.0, 40000.0)]
    a = apportion_by(300.0, 1.0, IDLE_W, rows, BF16)
    got = {s.request_id: s for s in a.shares}
    fixed_each = IDLE_W * 40.0 * BF16.step_s / 2.0  # 40 steps, two in each
    own = {"short": BF16.beta * 40 + BF16.gamma * 4000, "long": BF16.beta * 40 + BF16.gamma * 40000}
    rest = IDLE_W - 2 * fixed_each
    for rid in own:
        assert got[rid].static_j == pytest.approx(
            fixed_each + rest * own[rid] / sum(own.values()), rel=1e-12)


def test_without_step_s_the_static_power_goes_by_residency() -> None:
    rows = [WorkRow("prompt", 0, 20000.0, 1.0, 1.0, 0.0, 0.0),
            WorkRow("decoder", 0, 0.0, 50.0, 1.0, 0.0, 25000.0)]
    c = DEFAULTS["bf16"].__class__(BF16.alpha, BF16.beta, BF16.gamma, BF16.delta)
    a = apportion_by(600.0, 1.0, IDLE_W, rows, c)
    assert [s.static_j for s in a.shares] == pytest.approx([IDLE_W / 2.0, IDLE_W / 2.0])
