"""A journal written before the record codec carried a version (lines as bare JSON arrays)
replays under today's codec: the records come back, and a restarted service writes them to
the ledger. The fixture (tests/accounting/fixtures/) was written by that code's `Journal`
from `fixture_records()`, and its last line was then torn as a crash leaves it."""

from __future__ import annotations

import dataclasses
import shutil
import sqlite3
from pathlib import Path

import pytest

from accounting.config import AccountingConfig, JournalConfig, LedgerConfig
from accounting.journal import read_segment, recover
from accounting.service import AccountingService, EngineInfo
from core.records import RequestRecord
from core.timing import Latency

FIXTURES = Path(__file__).resolve().parent / "fixtures"
UNVERSIONED = FIXTURES / "journal-unversioned"
T0 = 1_780_000_000.0  # wall clock of the fixture's first arrival


def fixture_records() -> list[RequestRecord]:
    """The records in the fixture: a stream, a non-streamed answer, a refusal that reached no
    engine, a cut-off stream counted by the gateway's tokenizer, and a timed-out request whose
    tokens were estimated; non-ASCII in a tenant and a model name."""
    stream = RequestRecord(
        request_id="r-stream", tenant="acme", model="m", engine="e0", precision="bf16",
        slo_class="interactive", status="ok", http_status=200, stream=True, arrived_wall_s=T0,
        arrived_s=100.0, dispatched_s=100.001, first_byte_s=100.05, first_token_s=100.06,
        finished_s=100.5, read_times=(100.06, 100.1, 100.3), read_events=(1, 2, 1),
        prompt_tokens=812, completion_tokens=7, attempts=1,
        latency=Latency(0.06, 0.0733, 0.5, (0.04, 0.2), (0.02, 0.1)), slo_met=True)
    replace = dataclasses.replace
    return [
        stream,
        replace(stream, request_id="r-plain", tenant="Ünïcode \"t\"", model="m/ß", engine="e1",
                precision="fp8", slo_class="batch", stream=False, arrived_wall_s=T0 + 1.25,
                arrived_s=101.25, dispatched_s=101.26, first_byte_s=102.0, first_token_s=None,
                finished_s=102.01, read_times=(), read_events=(), prompt_tokens=40,
                completion_tokens=300, attempts=2, latency=Latency(None, None, 0.76, (), ()),
                slo_met=False, engine_done_s=102.0),
        replace(stream, request_id="r-refused", engine="", precision="", status="rate_limited",
                http_status=429, arrived_wall_s=T0 + 2.0, arrived_s=102.0, dispatched_s=None,
                first_byte_s=None, first_token_s=None, finished_s=102.0005, read_times=(),
                read_events=(), prompt_tokens=0, completion_tokens=0, attempts=0,
                latency=Latency(None, None, None, (), ()), slo_met=False),
        replace(stream, request_id="r-cut", tenant="beta", status="client_disconnected",
                http_status=499, arrived_wall_s=T0 + 3.0, arrived_s=103.0, dispatched_s=103.01,
                first_byte_s=103.2, first_token_s=103.21, finished_s=104.0,
                read_times=(103.21, 103.5), read_events=(1, 1), prompt_tokens=9,
                completion_tokens=2, slo_met=False, prompt_source="gateway",
                latency=Latency(0.21, 0.29, None, (0.29,), (0.29,))),
        replace(stream, request_id="r-timeout", tenant="beta", status="upstream_timeout",
                http_status=504, arrived_wall_s=T0 + 4.0, arrived_s=104.0, dispatched_s=104.0,
                first_byte_s=None, first_token_s=None, finished_s=134.0, read_times=(),
                read_events=(), prompt_tokens=1500, completion_tokens=0, attempts=3,
                slo_met=False, prompt_source="estimate",
                latency=Latency(None, None, None, (), ())),
    ]


def _without_samples(rec: RequestRecord) -> RequestRecord:
    """The record as a journal keeps it: the latency without its ITL samples."""
    lat = rec.latency
    return dataclasses.replace(rec, latency=Latency(lat.ttft_s, lat.tpot_s, lat.e2e_s, (), ()))


def test_an_unversioned_segment_reads_back_every_record_and_skips_the_torn_line() -> None:
    (segment,) = UNVERSIONED.glob("*.jsonl")
    got, skipped = read_segment(segment)
    assert skipped == 1  # the torn copy of the first record at the end
    assert got == [_without_samples(r) for r in fixture_records()]


@pytest.mark.timeout(60)
async def test_a_restarted_service_writes_an_unversioned_journal_to_the_ledger(
        tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    shutil.copytree(UNVERSIONED, journal)
    assert len(recover(journal).records) == len(fixture_records())
    cfg = AccountingConfig(ledger=LedgerConfig(path=str(tmp_path / "ledger.db")),
                           journal=JournalConfig(enabled=True, path=str(journal)))
    svc = AccountingService(cfg, [EngineInfo("e0", "m", "bf16", 1),
                                  EngineInfo("e1", "m/ß", "fp8", 1)])
    await svc.start()
    await svc.stop()
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        rows = dict(db.execute("SELECT request_id, tenant FROM requests"))
        sources = dict(db.execute("SELECT request_id, prompt_source FROM requests"))
    assert rows == {r.request_id: r.tenant for r in fixture_records()}
    assert sources["r-cut"] == "gateway" and sources["r-timeout"] == "estimate"
    assert not list(journal.glob("*.jsonl"))  # replayed, then deleted
