"""The ledger's rows read back by name: what a store commits comes back field for field, with
every field holding a value of its own, so a column read into the wrong field shows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from accounting.counters import CounterState
from accounting.ledger.base import EngineState, IntervalRow, RequestRow
from accounting.ledger.common import INTERVAL_FIELDS
from accounting.ledger.rollups import IntervalAccounts
from accounting.ledger.sqlite import SqliteLedger
from core.records import RequestRecord
from core.timing import Latency


def test_an_interval_rows_fields_are_the_columns_its_select_names() -> None:
    assert tuple(f.name for f in dataclasses.fields(IntervalRow)) == INTERVAL_FIELDS
    assert len(IntervalAccounts._fields) == 13  # sql.USAGE_IDLE's columns


def test_a_request_rows_fields_hold_their_records_values_by_name() -> None:
    """RequestRow.from_record builds its row positionally: each field, read by name, holds
    the record's value of that name (every value distinct, so a swap shows)."""
    rec = RequestRecord(
        request_id="rid", tenant="ten", model="mod", engine="eng", precision="fp8",
        slo_class="cls", status="upstream_timeout", http_status=504, stream=True,
        arrived_wall_s=7200.5, arrived_s=10.0, dispatched_s=10.25, first_byte_s=10.375,
        first_token_s=10.5, finished_s=13.0, read_times=(10.5, 11.75), read_events=(1, 2),
        prompt_tokens=17, completion_tokens=23, attempts=2,
        latency=Latency(0.5, 0.625, 3.0, (), ()), slo_met=True, prompt_source="gateway")
    work = [("rid", 7201, 17.0, 2.0, 0.5, 0.0, 40.0, 0.0, 0.0),
            ("rid", 7202, 0.0, 21.0, 0.5, 0.0, 500.0, 0.0, 0.0)]
    row = RequestRow.from_record(rec, 1.0, "rep", work)
    assert row._asdict() == {
        "request_id": "rid", "tenant": "ten", "model": "mod", "engine": "eng",
        "precision": "fp8", "slo_class": "cls", "status": "upstream_timeout", "stream": 1,
        "arrived_s": 7200.5, "finished_s": 7203.5, "finished_hour": 2, "prompt_tokens": 17,
        "completion_tokens": 23, "slo_met": 1, "first_interval": 7201, "last_interval": 7203,
        "replica": "rep", "prompt_source": "gateway", "http_status": 504, "outcome": "failed",
        "delivered_s": 7202.25}


@pytest.mark.timeout(30)
async def test_a_committed_interval_and_state_read_back_field_for_field(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "ledger.db")
    await ledger.open()
    try:
        # each float distinct: a swapped column cannot read back equal
        interval = IntervalRow(
            engine="e0", interval_idx=7, start_s=7.0, interval_s=1.0, model="m",
            precision="fp8", gpus=2, energy_j=101.5, static_j=20.25, dynamic_j=60.125,
            idle_j=21.125, idle_s=0.375, idle_carbon_g=0.0625, idle_cost_usd=0.03125,
            estimated=True, alpha=1.5, beta=2.5, gamma=3.5, failed_j=4.5,
            failed_carbon_g=0.015625, failed_cost_usd=0.0078125)
        state = EngineState(
            engine="e0", next_interval=8, boundary_s=8.0, boundary_j=1234.5, resets=3,
            counter=CounterState(seen_s=8.25, raw_j=(10.5, 11.5), offset_j=(0.5, 1.5),
                                 resets=2, metered_j=99.75),
            apportioned_j=98.25)
        await ledger.commit("e0", [interval], [], [], state)
        assert await ledger.intervals("e0", [7]) == [interval]
        assert await ledger.states() == {"e0": state}
        usage = await ledger.usage(0.0, 3600.0, None)
        assert usage.idle == [("e0", "m", "fp8", 0, 21.125, 0.0625, 0.03125, 1, 7.0, 8.0)]
        assert usage.failed == [("e0", "m", "fp8", 0, 4.5, 0.015625, 0.0078125, 1)]
    finally:
        await ledger.close()
