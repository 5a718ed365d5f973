"""`wattgate demo`: the whole demo (loadgen/demo.py), or with --serve only its simulated fleet
and gateway, left up for you to use.

The quick start runs on --serve: it needs no fixed port (0, the default, picks free ones),
and it writes what the next commands need into the output folder: `gateway.yaml` (the config,
whose ledger `wattgate report --config` reads), `fleet.yaml`, and `gateway.url` while the
gateway is ready. SIGINT or SIGTERM stops both processes.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import click


@click.command()
@click.option("--duration", "duration_s", type=float, default=60.0, show_default=True,
              help="Seconds of the three-tenant load is half of it; then a capacity search "
                   "per precision (trials of DURATION/7.5 s; at 60 s or more, seeds are added "
                   "while a capacity's interval is wider than +/-10 %) and a routing "
                   "comparison, about 6 minutes in all at the default.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("out/demo"), show_default=True)
@click.option("--keep-running", is_flag=True, help="Leave the gateway and fleet up afterwards.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--serve", is_flag=True,
              help="Only start the fleet and the gateway and leave them up (no load): writes "
                   "OUT/gateway.yaml, and OUT/gateway.url once the gateway is ready.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="The gateway's port (0: a free one).")
@click.option("--base-port", type=click.IntRange(0, 65535 - 8), default=0, show_default=True,
              help="The simulated engines' first port; engine i gets BASE+i (0: free ones).")
def demo(duration_s: float, out_dir: Path, keep_running: bool, seed: int, serve: bool,
         port: int, base_port: int) -> None:
    """Start a simulated fleet and the gateway, run multi-tenant bursty load, compare
    precisions, write an HTML report, then stop everything (--serve: start them only)."""
    if serve:
        sys.exit(serve_stack(out_dir, port, base_port))
    from loadgen.demo import run_demo

    sys.exit(run_demo(duration_s=duration_s, out_dir=out_dir, keep_running=keep_running,
                      seed=seed, port=port, base_port=base_port))


def serve_stack(out_dir: Path, port: int, base_port: int) -> int:
    """Start the fleet and the gateway, announce them, wait for a signal, stop them; the
    exit status (1 when either failed to start)."""
    from loadgen.demo import write_configs
    from loadgen.procs import started, wait_http

    out_dir = out_dir.resolve()  # the processes run from the repository root
    out_dir.mkdir(parents=True, exist_ok=True)
    url_file = out_dir / "gateway.url"
    url_file.unlink(missing_ok=True)  # present only while this run's gateway is ready
    fleet_file, gw_file, port, engine_urls = write_configs(out_dir, out_dir / "ledger.db",
                                                           port, base_port)
    base_url = f"http://127.0.0.1:{port}"
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: its terminal closed
        signal.signal(sig, lambda *_: stop.set())
    with open(out_dir / "fleet.log", "w") as flog, open(out_dir / "gateway.log", "w") as glog:
        try:
            with started(["sim", "fleet", str(fleet_file)], flog) as fleet:
                for url in engine_urls:
                    wait_http(f"{url}/health", fleet, 60)
                with started(["serve", "--config", str(gw_file)], glog) as gateway:
                    wait_http(f"{base_url}/readyz", gateway, 60)
                    url_file.write_text(base_url + "\n")
                    _announce(base_url, engine_urls, gw_file)
                    while not stop.wait(1.0):
                        if gateway.poll() is not None or fleet.poll() is not None:
                            raise RuntimeError("the gateway or the fleet exited")
        except (RuntimeError, TimeoutError) as exc:
            click.echo(f"error: {exc} (logs in {out_dir})", err=True)
            return 1
        finally:
            url_file.unlink(missing_ok=True)
    return 0


def _announce(base_url: str, engine_urls: list[str], gw_file: Path) -> None:
    click.echo(f"gateway  {base_url}  (keys sk-demo-acme, sk-demo-globex, sk-demo-initech; "
               "admin sk-demo-admin)")
    click.echo(f"engines  {', '.join(engine_urls)}")
    click.echo(f"config   {gw_file}  (wattgate report --config {gw_file})")
    click.echo("running; Ctrl-C or SIGTERM stops the gateway and the fleet")
