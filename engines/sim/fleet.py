"""Several simulated engines in one process, from one YAML file.

```yaml
defaults: {gpu: h100, model: llama-3.1-8b, served_model_name: llama-3.1-8b}
engines:
  - {name: h100-bf16, precision: bf16, dialect: vllm, port: 8101}
```
Each engine entry takes the fields of `wattgate sim` (dashes or underscores); `defaults`
fills what an entry leaves out.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from engines.sim.config import SimConfig, SimConfigError, config_from_mapping
from engines.sim.server import RunningEngine, start_engine, stop_engine


def load_fleet(path: Path) -> list[SimConfig]:
    """Validated engine configs of a fleet file; raises SimConfigError naming the field."""
    try:
        raw: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SimConfigError(f"{path}: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("engines"), list) or not raw["engines"]:
        raise SimConfigError(f"{path}: engines: must be a non-empty list")
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise SimConfigError(f"{path}: defaults: must be a mapping")
    configs = []
    for i, entry in enumerate(raw["engines"]):
        if not isinstance(entry, dict):
            raise SimConfigError(f"engines[{i}]: must be a mapping")
        configs.append(config_from_mapping({**defaults, **entry}, f"engines[{i}]"))
    ports = [c.port for c in configs if c.port]
    if len(ports) != len(set(ports)):
        raise SimConfigError("engines: two engines share a port")
    labels = [c.label for c in configs]
    if len(labels) != len(set(labels)):
        raise SimConfigError("engines: two engines share a name")
    return configs


def rewrite_urls(doc: Any, urls: dict[str, str]) -> Any:
    """`doc` (parsed YAML or JSON) with every string that names a URL of `urls` (a trailing
    slash aside) replaced by its new URL: a gateway config's endpoint and meter URLs follow
    their engines to the ports they took."""
    if isinstance(doc, dict):
        return {k: rewrite_urls(v, urls) for k, v in doc.items()}
    if isinstance(doc, list):
        return [rewrite_urls(v, urls) for v in doc]
    if isinstance(doc, str):
        return urls.get(doc.rstrip("/"), doc)
    return doc


def write_gateway_config(source: Path, target: Path, urls: dict[str, str]) -> None:
    """A copy of the gateway config `source` at `target` whose URLs follow `urls`. Its relative
    file paths (ledger, journal, CSV series) still name the files `source` names: the copy's
    `paths_relative_to` is the folder `source`'s were relative to."""
    doc = rewrite_urls(yaml.safe_load(source.read_text()), urls)
    base = source.resolve().parent
    if isinstance(doc.get("paths_relative_to"), str):
        base = base / doc["paths_relative_to"]
    doc["paths_relative_to"] = str(base)
    target.parent.mkdir(parents=True, exist_ok=True)  # a fresh clone has no out/ yet
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.replace(target)  # whole or not at all: a reader never sees half a config


async def serve_until_signal(configs: Sequence[SimConfig],
                             announce: Callable[[str], None] = print,
                             on_ready: Callable[[list[str]], None] | None = None) -> None:
    """Start every engine, announce `ready NAME URL` per engine, call `on_ready` with their
    URLs in order once all are up, serve until SIGINT/SIGTERM."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started: list[RunningEngine] = []
    try:
        for cfg in configs:
            engine = await start_engine(cfg)
            started.append(engine)
            announce(f"ready {cfg.label} {engine.url}")
        if on_ready is not None:
            on_ready([e.url for e in started])
        await stop.wait()
    finally:
        for engine in reversed(started):
            await stop_engine(engine)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
