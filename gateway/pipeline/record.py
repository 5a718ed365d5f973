"""The record step: a finished `Flight` becomes one `RequestRecord`, handed to every sink.

A request whose engine never reported usage has its prompt counted first (the model's
tokenizer off the event loop, else the byte estimate), so it is still charged for what the
engine read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from gateway.config import GatewayConfig
from gateway.pipeline.flight import Flight
from gateway.records import RequestRecord
from gateway.tenancy.admission import Admission
from gateway.timing import latency_of, slo_met
from gateway.tokenizer import PromptCounter

log = logging.getLogger("wattgate.proxy")

Sink = Callable[[RequestRecord], None]


class Recorder:
    __slots__ = ("admission", "clock", "config", "counter", "sinks", "slo_by_name")

    def __init__(self, config: GatewayConfig, admission: Admission, counter: PromptCounter,
                 sinks: Sequence[Sink], clock: Callable[[], float]):
        self.config = config
        self.admission = admission
        self.counter = counter
        self.sinks = tuple(sinks)
        self.clock = clock
        # config.slo() scans the classes: one dict lookup per record instead
        self.slo_by_name = {slo.name: slo for slo in config.slo_classes}

    async def count_prompt(self, flight: Flight) -> None:
        """The prompt's tokens, counted by the gateway (`flight.needs_prompt_count()`)."""
        try:
            assert flight.body is not None
            if self.counter.has_tokenizer(flight.model):
                tokens, source = await asyncio.to_thread(self.counter.count, flight.model,
                                                         flight.body)
            else:  # the byte estimate: cheap enough for the loop
                tokens, source = self.counter.count(flight.model, flight.body)
            flight.prompt_tokens, flight.prompt_source = tokens, source
        except Exception:  # a tokenizer failure must not lose the record: it keeps 0 tokens
            log.warning("request %s: counting its prompt failed", flight.request_id,
                        exc_info=True)

    def finish(self, flight: Flight, finished: float | None = None) -> None:
        """Record `flight`, which ended at `finished` (monotonic; None: now); settle what the
        tenant controls hold for it."""
        if finished is None:
            finished = self.clock()
        ep = flight.endpoint
        endpoint = ep.endpoint if ep is not None else None
        ok = flight.status == "ok"
        times, events = tuple(flight.read_times), tuple(flight.read_events)
        lat = latency_of(flight.arrived_s, times, events, flight.completion_tokens,
                         finished if flight.first_byte_s is not None else None)
        slo = self.slo_by_name[flight.slo_class]
        record = RequestRecord(
            request_id=flight.request_id, tenant=flight.tenant, model=flight.model,
            engine=endpoint.name if endpoint else "",
            precision=endpoint.precision if endpoint else "",
            slo_class=flight.slo_class, status=flight.status, http_status=flight.http_status,
            stream=flight.stream, arrived_wall_s=flight.arrived_wall_s,
            arrived_s=flight.arrived_s, dispatched_s=flight.dispatched_s,
            first_byte_s=flight.first_byte_s, first_token_s=flight.first_token_s,
            finished_s=finished, read_times=times, read_events=events,
            prompt_tokens=flight.prompt_tokens,
            completion_tokens=flight.completion_tokens, attempts=flight.attempts, latency=lat,
            slo_met=slo_met(slo, lat, ok), prompt_source=flight.prompt_source,
            engine_done_s=flight.engine_done_s, trace=flight.trace,
        )
        if flight.ticket is not None:
            self.admission.release(flight.ticket, record)
        for sink in self.sinks:
            try:
                sink(record)
            except Exception:  # a broken sink must not lose the record for the others
                log.exception("record sink failed for request %s", flight.request_id)
