"""The admit step: API key -> tenant, the body read once into a `PreparedRequest`, and the
tenant's limits and budgets (429 past a limit; a budget downgrade forces a cheaper precision).
"""

from __future__ import annotations

import asyncio
import math

from core.errors import ModelNotFoundError
from core.tokenizer import PromptCounter
from gateway.auth import Authenticator
from gateway.config import GatewayConfig, ModelPool
from gateway.pipeline.flight import Flight
from gateway.requests import PreparedRequest, check_content_type, prepare
from gateway.tenancy.admission import Admission
from gateway.upstreams import Upstreams
from wire.exchange import ServerExchange


def shared_upstream_model(pool: ModelPool) -> str | None:
    """The model name every engine of the pool serves; None when they differ."""
    names = {ep.upstream_model for ep in pool.endpoints}
    return names.pop() if len(names) == 1 else None


class Admit:
    """Who is asking, for what, and may they: everything decided before routing."""

    __slots__ = ("admission", "auth", "counter", "estimate", "max_body_bytes", "prefix_chars",
                 "upstream_models", "upstreams")

    def __init__(self, config: GatewayConfig, admission: Admission, upstreams: Upstreams, *,
                 prefix_chars: int, estimate: bool, counter: PromptCounter):
        """`prefix_chars` (> 0) and `estimate`: what routing will read of the request;
        `counter`: the models' tokenizers, for a budgeted tenant's prompt."""
        self.auth = Authenticator(config)
        self.counter = counter
        self.admission = admission
        self.upstreams = upstreams
        self.max_body_bytes = config.max_body_bytes
        self.upstream_models = {pool.name: shared_upstream_model(pool) for pool in config.models}
        self.prefix_chars = prefix_chars
        self.estimate = estimate

    async def admit(self, exchange: ServerExchange, flight: Flight) -> PreparedRequest:
        """The prepared request; raises the WattgateError that answers the client."""
        tenant = self.auth.tenant(exchange.header("authorization"))
        flight.tenant, flight.slo_class, flight.tenant_config = tenant.name, tenant.slo_class, tenant
        check_content_type(exchange.header("content-type") or "")
        raw = await exchange.read_body(self.max_body_bytes)
        controlled = self.admission.controlled(tenant)
        req = prepare(raw, exchange.header("x-wattgate-precision"), self.upstream_models,
                      prefix_chars=self.prefix_chars, estimate=self.estimate or controlled)
        flight.stream = req.stream
        flight.body = req.body
        if req.model not in self.upstream_models:
            raise ModelNotFoundError(f"the model {req.model!r} does not exist", param="model")
        flight.model = req.model
        if controlled:
            assert req.prompt_estimate is not None  # asked for above
            available = {s.endpoint.precision for s in self.upstreams.healthy(req.model)}
            prompt_tokens = math.ceil(req.prompt_estimate)
            if tenant.budgets.budgets and self.counter.has_tokenizer(req.model):
                # a budget reserves by the prompt's real length: counted off the event loop,
                # and only for budgeted tenants (nobody else waits for a tokenizer)
                prompt_tokens, _ = await asyncio.to_thread(self.counter.count, req.model,
                                                           req.body)
            flight.ticket = await self.admission.admit(
                tenant, flight.request_id, req.model, prompt_tokens, req.max_tokens,
                req.precision, available)
        return req
