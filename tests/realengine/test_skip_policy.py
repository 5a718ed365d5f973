"""The real-engine suite skips without vLLM or GuideLLM, but fails instead where the extras are
required (WATTGATE_REQUIRE_EXTRAS=1, as `.ci/run` sets after installing them)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tests.realengine import conftest
from tests.realengine.conftest import require_vllm
from tests.support.extras import REQUIRE_ENV


def _without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == "vllm" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_missing_vllm_skips_with_the_install_hint(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _without_vllm(monkeypatch)
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"\.ci/vllm-cpu\.sh"):
        require_vllm()


def test_missing_vllm_fails_where_extras_are_required(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_vllm(monkeypatch)
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=REQUIRE_ENV):
        require_vllm()


def _without_guidellm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(conftest, "GUIDELLM", tmp_path / "no-such-guidellm")


def test_missing_guidellm_skips_with_the_install_hint(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _without_guidellm(monkeypatch, tmp_path)
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"\.ci/guidellm\.sh"):
        conftest.require_guidellm()


def test_missing_guidellm_fails_where_extras_are_required(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _without_guidellm(monkeypatch, tmp_path)
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=REQUIRE_ENV):
        conftest.require_guidellm()
