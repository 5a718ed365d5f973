"""The 429 of tenant controls, with OpenAI's rate-limit headers."""

from __future__ import annotations

import math

from core.errors import WattgateError


class TenantLimitError(WattgateError):
    """A tenant is past one of its limits: `rate_limit_exceeded` or `budget_exceeded`."""

    status = 429
    error_type = "requests"  # OpenAI answers its 429s with type "requests"
    default_code = "rate_limit_exceeded"

    def __init__(self, message: str, *, code: str | None = None,
                 retry_after_s: float | None = None, headers: dict[str, str] | None = None):
        finite = retry_after_s if retry_after_s is not None and math.isfinite(retry_after_s) \
            else None
        super().__init__(message, code=code, retry_after_s=finite)
        self.extra_headers = headers or {}

    def headers(self) -> dict[str, str]:
        return {**self.extra_headers, **super().headers()}


class BudgetExceededError(TenantLimitError):
    """A tenant's budget has no room for the request (OpenAI's quota errors use this type)."""

    error_type = "insufficient_quota"
    default_code = "budget_exceeded"
