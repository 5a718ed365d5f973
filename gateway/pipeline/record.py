"""The record step: a finished `Flight` becomes one `RequestRecord`, handed to every sink.

A request whose engine never reported usage has its prompt counted first, so it is still
charged for what the engine read: by the engine itself where it can say (vLLM's
`POST /tokenize` with the same model and prompt or messages: the count its usage would have
given), else with the model's tokenizer off the event loop, else the byte estimate.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from core.records import RequestRecord
from core.timing import latency_of, slo_met
from core.tokenizer import PromptCounter
from gateway.config import GatewayConfig
from gateway.pipeline.flight import Flight, token_count
from gateway.sse import json_object
from gateway.tenancy.admission import Admission
from wire.client import UpstreamClient
from wire.errors import UpstreamFailure

log = logging.getLogger("wattgate.proxy")

Sink = Callable[[RequestRecord], None]
TOKENIZE_TIMEOUT_S = 2.0  # an engine slower than this to count a prompt: the gateway counts it
# what vLLM's chat template reads besides the messages
_CHAT_TEMPLATE_FIELDS = ("tools", "chat_template", "chat_template_kwargs",
                         "add_generation_prompt", "continue_final_message")


def tokenize_body(body: Mapping[str, Any], upstream_model: str) -> bytes | None:
    """The body of vLLM's `POST /tokenize` for a request's prompt (its `messages` with what
    the chat template reads, or its text `prompt`); None when there is nothing to ask (token
    ids are counted as they are, a batch of prompts is not one count)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        out = {"model": upstream_model, "messages": messages}
        out.update((k, body[k]) for k in _CHAT_TEMPLATE_FIELDS if k in body)
        return orjson.dumps(out)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return orjson.dumps({"model": upstream_model, "prompt": prompt})
    return None


class RecordPublisher:
    """Turns each finished `Flight` into its `RequestRecord` and hands it to every sink."""

    __slots__ = ("admission", "client", "clock", "config", "counter", "sinks", "slo_by_name")

    def __init__(self, config: GatewayConfig, admission: Admission, counter: PromptCounter,
                 sinks: Sequence[Sink], clock: Callable[[], float],
                 client: UpstreamClient | None = None):
        """`client`: the engines' client, to ask a vLLM engine to count a prompt."""
        self.config = config
        self.admission = admission
        self.counter = counter
        self.client = client
        self.sinks = tuple(sinks)
        self.clock = clock
        # config.slo() scans the classes: one dict lookup per record instead
        self.slo_by_name = {slo.name: slo for slo in config.slo_classes}

    async def count_prompt(self, flight: Flight) -> None:
        """The prompt's tokens, counted by the gateway (`flight.needs_prompt_count()`)."""
        try:
            assert flight.body is not None
            counted = await self.engine_count(flight)
            if counted is not None:
                flight.prompt_tokens, flight.prompt_source = counted, "engine_tokenize"
                return
            if self.counter.has_tokenizer(flight.model):
                tokens, source = await asyncio.to_thread(self.counter.count, flight.model,
                                                         flight.body)
            else:  # the byte estimate: cheap enough for the loop
                tokens, source = self.counter.count(flight.model, flight.body)
            flight.prompt_tokens, flight.prompt_source = tokens, source
        except Exception:  # a tokenizer failure must not lose the record: it keeps 0 tokens
            log.warning("request %s: counting its prompt failed", flight.request_id,
                        exc_info=True)

    async def engine_count(self, flight: Flight) -> int | None:
        """The prompt's tokens as the vLLM engine that served `flight` counts them (its
        `POST /tokenize`); None where it cannot say (another dialect, no answer in
        TOKENIZE_TIMEOUT_S, an error)."""
        state = flight.endpoint
        if self.client is None or state is None or state.endpoint.kind != "vllm":
            return None
        assert flight.body is not None
        payload = tokenize_body(flight.body, state.endpoint.upstream_model)
        if payload is None:
            return None
        resp = None
        try:
            async with asyncio.timeout(TOKENIZE_TIMEOUT_S):
                resp = await self.client.post(state.endpoint.url, "/tokenize", payload,
                                              [("Content-Type", "application/json")])
                raw = await resp.read_all()
        except (UpstreamFailure, TimeoutError):
            if resp is not None:
                resp.abort()
            return None
        resp.close()
        doc = json_object(raw) if resp.status == 200 else None
        count = doc.get("count") if doc is not None else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            return None
        return token_count(count)

    def publish(self, flight: Flight, finished: float | None = None) -> None:
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
            engine_done_s=flight.engine_done_s, step_from_s=flight.step_from_s,
            trace=flight.trace,
        )
        if flight.ticket is not None:
            self.admission.release(flight.ticket, record)
        for sink in self.sinks:
            try:
                sink(record)
            except Exception:  # a broken sink must not lose the record for the others
                log.exception("record sink failed for request %s", flight.request_id)
