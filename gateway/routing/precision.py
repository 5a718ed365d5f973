"""Which precisions a request may be served at (pure): tenant policy + per-request override."""

from __future__ import annotations

from collections.abc import Collection

from core.errors import PermissionDeniedError, RequestError
from gateway.config import PRECISIONS, PrecisionPolicy


def split_model(model: str) -> tuple[str, str | None]:
    """`llama@fp8` -> ("llama", "fp8"); `llama` -> ("llama", None)."""
    name, sep, precision = model.partition("@")
    return (name, precision) if sep else (model, None)


def select_precisions(policy: PrecisionPolicy, override: str | None,
                      available: Collection[str]) -> tuple[str, ...]:
    """Precisions to try, best first, among those with a healthy endpoint (`available`).

    An override must be a known precision the tenant may use; otherwise the tenant's preferred
    precisions come first, then the rest of its allowed ones. An empty result means no healthy
    endpoint can serve the request.
    """
    if override is not None:
        if override not in PRECISIONS:
            raise RequestError(f"unknown precision {override!r}; use one of {', '.join(PRECISIONS)}",
                               code="invalid_precision", param="model")
        if override not in policy.allowed:
            raise PermissionDeniedError(f"precision {override!r} is not allowed for this API key")
        return (override,) if override in available else ()
    for p in policy.preferred:
        if p in available:
            return (p,)
    return tuple(p for p in policy.allowed if p in available)
