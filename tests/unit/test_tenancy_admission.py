"""Admission without a network: a refused request gives its tokens back, and a budgeted
tenant fails closed (503) when the ledger cannot be reached."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from accounting.ledger.base import LedgerError
from accounting.pricing import Pricing
from core.errors import OverloadedError
from core.tokenizer import BYTES_PER_TOKEN
from gateway.config import parse_config
from gateway.requests import asked_tokens, prompt_estimate
from gateway.tenancy.admission import Admission
from gateway.tenancy.errors import TenantLimitError
from gateway.tenancy.metrics import TenancyMetrics
from gateway.tenancy.store import TenancyStore
from tests.support.gateway import raw_config

EP = [{"name": "e", "url": "http://127.0.0.1:1", "precision": "bf16"}]


class DownLedger:
    async def locked(self, *args: Any) -> None:
        raise LedgerError("connection refused")


def config(**tenant: Any) -> Any:
    raw = raw_config(EP, accounting={"ledger": {"kind": "sqlite", "path": "/tmp/unused.db"}})
    raw["tenants"][0].update(tenant)
    return parse_config(raw, env={})


async def test_a_budgeted_tenant_fails_closed_when_the_ledger_is_down() -> None:
    cfg = config(limits={"tokens_per_minute": 1000}, budgets=[{"period": "day", "usd": 1}])
    store = TenancyStore(DownLedger(), "r", cfg.tenant_controls,  # type: ignore[arg-type]
                         Pricing(), lambda: 0.0)
    admission = Admission(cfg, None, clock=lambda: 0.0, store=store)
    with pytest.raises(OverloadedError) as exc:
        await admission.admit(cfg.tenants[0], "id", "m", 10, 90, None, {"bf16"})
    assert exc.value.status == 503 and exc.value.code == "ledger_unavailable"
    # the 100 tokens it took went back
    assert admission.limiters["tenant-a"].headers(0.0)["x-ratelimit-remaining-tokens"] == "1000"


async def test_local_cap_without_a_ledger_and_token_estimates() -> None:
    raw = raw_config(EP)
    raw["tenants"][0]["limits"] = {"max_concurrent": 1}
    cfg = parse_config(raw, env={})
    admission = Admission(cfg, None, clock=lambda: 0.0)
    ticket = await admission.admit(cfg.tenants[0], "a", "m", 1, 4, None, {"bf16"})
    assert ticket.local_slot
    with pytest.raises(TenantLimitError):
        await admission.admit(cfg.tenants[0], "b", "m", 1, 4, None, {"bf16"})
    assert (prompt_estimate({"prompt": "x" * 40}), asked_tokens({"max_tokens": 7})) == (10, 7)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3}
    assert asked_tokens(chat) == 3
    assert (prompt_estimate({"prompt": [1, 2, 3]}), asked_tokens({})) == (3, None)


def test_without_max_tokens_the_models_context_is_reserved() -> None:
    raw = raw_config(EP)
    raw["models"][0]["max_model_len"] = 4096
    cfg = parse_config(raw, env={})
    admission = Admission(cfg, None, clock=lambda: 0.0)
    model = cfg.models[0].name
    assert admission.output_tokens(model, 1000, 30) == 30  # max_tokens wins
    assert admission.output_tokens(model, 1000, None) == 3096  # what the context leaves
    assert admission.output_tokens(model, 5000, None) == 1
    assert Admission(config(), None, clock=lambda: 0.0).output_tokens(model, 1000, None) == (
        cfg.tenant_controls.default_max_tokens)


def test_budget_downgrade_pinned_and_max_model_len_are_checked_at_load() -> None:
    from core.errors import ConfigError

    assert config(budget_downgrade_pinned=True).tenants[0].budgets.downgrade_pinned
    with pytest.raises(ConfigError, match="budget_downgrade_pinned"):
        config(budget_downgrade_pinned="yes")
    raw = raw_config(EP)
    raw["models"][0]["max_model_len"] = 0
    with pytest.raises(ConfigError, match="max_model_len"):
        parse_config(raw, env={})


async def test_the_active_gauge_reads_the_requests_in_flight_when_scraped() -> None:
    """`wattgate_tenant_requests_active` is read from the admission's count at each scrape
    (nothing set per request), for the tenants with controls only."""
    raw = raw_config(EP)
    raw["tenants"][0]["limits"] = {"max_concurrent": 5}
    cfg = parse_config(raw, env={})
    registry = CollectorRegistry()
    admission = Admission(cfg, TenancyMetrics(registry), clock=lambda: 0.0)

    def active(tenant: str) -> float | None:
        return registry.get_sample_value("wattgate_tenant_requests_active", {"tenant": tenant})

    assert active("tenant-a") == 0 and active("tenant-b") is None
    for rid in ("a", "b"):
        await admission.admit(cfg.tenants[0], rid, "m", 1, 4, None, {"bf16"})
    assert active("tenant-a") == 2
    admission.active["tenant-a"] -= 1  # as a release does
    assert active("tenant-a") == 1


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec=None), max_size=60), st.booleans())
def test_a_prompts_estimate_is_its_utf8_size_over_four(text: str, chat: bool) -> None:
    """ASCII or not (surrogates included), as the bytes the engine would read say."""
    body: dict[str, Any] = ({"messages": [{"role": "user", "content": text}]} if chat
                            else {"prompt": text})
    joined = f"user\n{text}" if chat else text
    want = len(joined.encode("utf-8", "surrogatepass")) / BYTES_PER_TOKEN if joined else 0.0
    assert prompt_estimate(body) == want
