"""`wattgate serve` as a real process: official openai client, curl, graceful drain on SIGTERM."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import yaml

from tests.support.gateway import KEY_A, raw_config
from tests.support.procs import free_port, running, wattgate_cmd

pytestmark = pytest.mark.timeout(90)


@contextlib.contextmanager
def stack(tmp_path: Path, itl_s: float = 0.002) -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    eport, gport = free_port(), free_port()
    engine_url = f"http://127.0.0.1:{eport}"
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(yaml.safe_dump(raw_config(
        [{"name": "e1", "url": engine_url, "precision": "bf16"}], drain_timeout_s=20)))
    engine_cmd = [sys.executable, "-m", "tests.support.fake_engine", "--port", str(eport),
                  "--itl-s", str(itl_s), "--ttft-s", "0.01"]
    with running(engine_cmd, engine_url + "/health"), \
            running(wattgate_cmd("serve", "--config", str(cfg), "--port", str(gport)),
                    f"http://127.0.0.1:{gport}/readyz", log=tmp_path / "gw.log") as gw:
        yield f"http://127.0.0.1:{gport}", engine_url, gw


def test_openai_client_streaming_and_not_through_the_gateway(tmp_path: Path) -> None:
    with stack(tmp_path) as (gw, _, _), \
            openai.OpenAI(base_url=gw + "/v1", api_key=KEY_A, max_retries=0) as client, \
            openai.OpenAI(base_url=gw + "/v1", api_key="wrong", max_retries=0) as bad:
        chat = client.chat.completions.create(model="m", max_tokens=5,
                                              messages=[{"role": "user", "content": "hi"}])
        assert chat.choices[0].message.content == " tok" * 5
        assert chat.usage is not None and chat.usage.completion_tokens == 5
        chunks = list(client.chat.completions.create(
            model="m", max_tokens=7, stream=True, messages=[{"role": "user", "content": "hi"}]))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == " tok" * 7
        assert all(c.usage is None for c in chunks)  # not asked for: stripped
        pieces = list(client.completions.create(model="m", prompt="hi", max_tokens=4, stream=True,
                                                stream_options={"include_usage": True}))
        assert pieces[-1].usage is not None and pieces[-1].usage.completion_tokens == 4
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="no-such-model", prompt="x")
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_streams_through_the_gateway(tmp_path: Path) -> None:
    with stack(tmp_path) as (gw, _, _):
        out = subprocess.run(
            ["curl", "-sN", "-H", f"Authorization: Bearer {KEY_A}", "-H",
             "Content-Type: application/json", "-d",
             '{"model": "m", "prompt": "hi", "max_tokens": 3, "stream": true}',
             gw + "/v1/completions"], capture_output=True, text=True, timeout=30, check=True)
        assert out.stdout.count("data: ") == 4 and out.stdout.endswith("data: [DONE]\n\n")


def test_sigterm_drains_in_flight_streams_then_exits(tmp_path: Path) -> None:
    with stack(tmp_path, itl_s=0.01) as (gw, _, proc), \
            openai.OpenAI(base_url=gw + "/v1", api_key=KEY_A, max_retries=0) as client:
        result: list[str] = []

        def consume() -> None:
            stream = client.completions.create(model="m", prompt="x", max_tokens=150, stream=True)
            result.append("".join(c.choices[0].text for c in stream if c.choices))

        t = threading.Thread(target=consume)
        t.start()
        time.sleep(0.4)
        proc.send_signal(signal.SIGTERM)
        t.join(30)
        assert result == [" tok" * 150]  # the stream finished although shutdown began
        assert proc.wait(20) == 0
    assert "draining" in (tmp_path / "gw.log").read_text()
