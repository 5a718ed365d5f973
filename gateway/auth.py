"""API key -> tenant. Keys are compared by SHA-256 digest; the key itself is never stored."""

from __future__ import annotations

import hashlib
import hmac

from gateway.config import GatewayConfig, Tenant
from gateway.errors import AuthError


class Authenticator:
    def __init__(self, config: GatewayConfig):
        self.required = config.auth_required
        self.by_digest = {t.key_sha256: t for t in config.tenants}
        self.admin_digest = config.admin_key_sha256
        self.metrics_digest = config.metrics_key_sha256
        self.anonymous = Tenant(name="anonymous", key_sha256="", slo_class=config.default_slo_class)

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
