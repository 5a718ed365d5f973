"""API key -> tenant. Keys are compared by SHA-256 digest; the configuration holds digests only.

Hashing a key costs ~0.5 us, on every request; so the `Authorization` headers that named a
tenant are kept in memory (a bounded dict, never logged or written) and a repeat is one dict
lookup. A header that names no tenant is never kept: bad keys cannot fill the cache.
"""

from __future__ import annotations

import hashlib
import hmac

from core.errors import AuthError
from gateway.config import GatewayConfig, Tenant

# Distinct headers that named a tenant kept at once. Each tenant has one key, but spellings of
# one header (the scheme's case, spaces) differ: past the bound the cache starts again empty.
CACHE_MAX = 1024


class Authenticator:
    def __init__(self, config: GatewayConfig):
        self.required = config.auth_required
        self.by_digest = {t.key_sha256: t for t in config.tenants}
        self.admin_digest = config.admin_key_sha256
        self.metrics_digest = config.metrics_key_sha256
        self.anonymous = Tenant(name="anonymous", key_sha256="", slo_class=config.default_slo_class)
        self._known: dict[str, Tenant] = {}  # header -> its tenant (only headers that matched)

    @staticmethod
    def _bearer(header: str | None) -> str | None:
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return token.strip()

    def tenant(self, header: str | None) -> Tenant:
        """The tenant of an `Authorization: Bearer KEY` header; raises AuthError (401)."""
        if header is not None:
            # The dict compares a header's salted hash before its characters, so a lookup
            # tells a timing attacker nothing useful about a kept key.
            known = self._known.get(header)
            if known is not None:
                return known
        tenant = self._lookup(header)
        if header is not None and tenant is not self.anonymous:
            if len(self._known) >= CACHE_MAX:
                self._known.clear()
            self._known[header] = tenant
        return tenant

    def _lookup(self, header: str | None) -> Tenant:
        key = self._bearer(header)
        if key is None:
            if not self.required:
                return self.anonymous
            raise AuthError("missing API key: send it as 'Authorization: Bearer <key>'",
                            code="missing_api_key")
        tenant = self.by_digest.get(hashlib.sha256(key.encode()).hexdigest())
        if tenant is None:
            if not self.required:
                return self.anonymous
            raise AuthError("incorrect API key provided")
        return tenant

    def may_scrape(self, header: str | None) -> bool:
        """`/metrics` is open unless a metrics key is configured; then that key (or the
        admin key) is needed."""
        if not self.metrics_digest:
            return True
        key = self._bearer(header)
        if key is None:
            return False
        digest = hashlib.sha256(key.encode()).hexdigest()
        return hmac.compare_digest(digest, self.metrics_digest) or self.is_admin(header)

    def is_admin(self, header: str | None) -> bool:
        key = self._bearer(header)
        if key is None or not self.admin_digest:
            return False
        return hmac.compare_digest(hashlib.sha256(key.encode()).hexdigest(), self.admin_digest)
