"""`wattgate sim` (one simulated engine) and `wattgate sim fleet FILE` (several)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import click
import uvloop

from engines.sim.catalog import GPUS, MODELS, PRECISIONS
from engines.sim.config import DIALECTS, SimConfig, SimConfigError
from engines.sim.fleet import load_fleet, serve_until_signal, write_gateway_config
from wire.ports import taken_message


def _run(configs: list[SimConfig],
         on_ready: Callable[[list[str]], None] | None = None) -> None:
    taken = taken_message((c.host, c.port) for c in configs)
    if taken is not None:  # before any engine starts
        raise click.ClickException(taken)

    def announce(line: str) -> None:
        click.echo(line)

    try:
        uvloop.run(serve_until_signal(configs, announce, on_ready))
    except OSError as exc:
        raise click.ClickException(f"cannot serve: {exc}") from None


@click.group(invoke_without_command=True)
@click.option("--gpu", type=click.Choice(sorted(GPUS)), help="Catalogued GPU.")
@click.option("--model", type=click.Choice(sorted(MODELS)), help="Catalogued model.")
@click.option("--precision", type=click.Choice(sorted(PRECISIONS)), help="Weight precision.")
@click.option("--dialect", type=click.Choice(DIALECTS), default="vllm", show_default=True)
@click.option("--port", type=int, help="TCP port (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel GPUs.")
@click.option("--served-model-name", default=None, help="Model id in the API (default: --model).")
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="Simulated seconds per wall-clock second.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds response ids and token texts.")
@click.option("--max-batch", type=int, default=256, show_default=True,
              help="Most requests in one batch (vLLM --max-num-seqs).")
@click.option("--fixed-ttft-ms", type=float, default=None,
              help="Fixed timing: first token this long after arrival.")
@click.option("--fixed-itl-ms", type=float, default=None,
              help="Fixed timing: then one token every this long.")
@click.option("--tokens-per-event", type=int, default=1, show_default=True,
              help="Tokens coalesced per SSE event (vLLM --stream-interval).")
@click.option("--empty-text-share", type=float, default=0.02, show_default=True,
              help="Share of tokens whose text is empty (split UTF-8 character, special token).")
@click.option("--empty-text-share-non-ascii", type=float, default=0.25, show_default=True,
              help="The same share for a prompt without ASCII text (CJK, emoji).")
@click.option("--done-gap-ms", type=float, default=2.0, show_default=True,
              help="Pause between [DONE] and the end of a stream (a busy server's).")
@click.pass_context
def sim(ctx: click.Context, gpu: str | None, model: str | None, precision: str | None,
        dialect: str, port: int | None, host: str, tp: int, served_model_name: str | None,
        time_scale: float, seed: int, max_batch: int, fixed_ttft_ms: float | None,
        fixed_itl_ms: float | None, tokens_per_event: int, empty_text_share: float,
        empty_text_share_non_ascii: float, done_gap_ms: float) -> None:
    """Run a simulated vLLM / trtllm-serve engine (roofline timing, power model, energy counter)."""
    if ctx.invoked_subcommand is not None:
        return
    missing = [flag for flag, value in (("--gpu", gpu), ("--model", model),
                                        ("--precision", precision), ("--port", port))
               if value is None]
    if missing:
        raise click.UsageError(f"missing {', '.join(missing)}")
    assert gpu and model and precision and port is not None
    cfg = SimConfig(gpu, model, precision, dialect, port, host, tp, served_model_name,
                    time_scale, seed, max_batch, fixed_ttft_ms, fixed_itl_ms, tokens_per_event,
                    empty_text_share=empty_text_share,
                    empty_text_share_non_ascii=empty_text_share_non_ascii,
                    done_gap_ms=done_gap_ms)
    try:
        cfg.resolve()
    except SimConfigError as exc:
        raise click.ClickException(str(exc)) from None
    _run([cfg])


@sim.command("fleet")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--base-port", type=click.IntRange(0, 65535), default=None,
              help="Put engine i on BASE+i instead of its configured port (0: each on a free "
                   "port, printed on start).")
@click.option("--gateway-config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="A gateway config naming the engines at their configured ports.")
@click.option("--write-gateway-config", "config_out", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write --gateway-config here with its engine and meter URLs "
                                 "moved to the ports the engines took, once all are up.")
def fleet(file: Path, base_port: int | None, gateway_config: Path | None,
          config_out: Path | None) -> None:
    """Run every engine of a fleet YAML file in this process; one `ready NAME URL` line each."""
    if (gateway_config is None) != (config_out is None):
        raise click.UsageError("--gateway-config and --write-gateway-config go together")
    try:
        configs = load_fleet(file)
    except SimConfigError as exc:
        raise click.ClickException(str(exc)) from None
    configured = [f"http://{c.host}:{c.port}" for c in configs]
    if base_port is not None:
        if base_port + len(configs) - 1 > 65535:
            raise click.BadParameter(f"{len(configs)} engines do not fit from {base_port}",
                                     param_hint="--base-port")
        configs = [replace(c, port=base_port + i if base_port else 0)
                   for i, c in enumerate(configs)]

    def write(urls: list[str]) -> None:
        assert gateway_config is not None and config_out is not None
        write_gateway_config(gateway_config, config_out, dict(zip(configured, urls, strict=True)))
        click.echo(f"wrote {config_out}")

    _run(configs, write if gateway_config is not None else None)
