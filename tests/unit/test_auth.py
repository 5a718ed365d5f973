"""API key -> tenant, and the cache of headers that named a tenant."""

from __future__ import annotations

import hashlib

import pytest

from core.errors import AuthError
from gateway import auth
from gateway.auth import Authenticator
from gateway.config import GatewayConfig, parse_config

pytestmark = pytest.mark.timeout(10)


def config(*, required: bool = True) -> GatewayConfig:
    return parse_config({
        "auth_required": required,
        "tenants": [{"name": n, "api_key_sha256": hashlib.sha256(n.encode() * 2).hexdigest()}
                    for n in ("a", "b")],
        "models": [{"name": "m", "endpoints": [
            {"name": "e", "url": "http://127.0.0.1:9000", "kind": "vllm",
             "precision": "bf16"}]}]}, env={})


def test_a_key_names_its_tenant_and_again_from_the_cache() -> None:
    a = Authenticator(config())
    assert a.tenant("Bearer aa").name == "a"
    assert a.tenant("Bearer aa").name == "a"
    assert a.tenant("bearer  bb ").name == "b"
    assert set(a._known) == {"Bearer aa", "bearer  bb "}


def test_a_cached_key_skips_the_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    a = Authenticator(config())
    a.tenant("Bearer aa")
    calls: list[bytes] = []
    real = hashlib.sha256

    def counted(data: bytes) -> hashlib._Hash:
        calls.append(data)
        return real(data)

    monkeypatch.setattr(hashlib, "sha256", counted)
    assert a.tenant("Bearer aa").name == "a"
    assert calls == []
    assert a.tenant("Bearer bb").name == "b"
    assert calls == [b"bb"]


@pytest.mark.parametrize("header", [None, "", "Bearer ", "Basic aa", "Bearer wrong"])
def test_bad_keys_are_refused_every_time_and_never_kept(header: str | None) -> None:
    a = Authenticator(config())
    for _ in range(2):
        with pytest.raises(AuthError):
            a.tenant(header)
    assert a._known == {}


def test_without_required_auth_a_bad_key_is_anonymous_and_not_kept() -> None:
    a = Authenticator(config(required=False))
    assert a.tenant("Bearer wrong") is a.anonymous
    assert a.tenant(None) is a.anonymous
    assert a._known == {}
    assert a.tenant("Bearer aa").name == "a"


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "CACHE_MAX", 4)
    a = Authenticator(config())
    for i in range(10):  # spellings of one valid header, each kept
        assert a.tenant("Bearer aa" + " " * i).name == "a"
        assert len(a._known) <= 4
    assert a.tenant("Bearer aa" + " " * 9).name == "a"
