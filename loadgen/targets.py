"""Where the load goes: the targets a command's options name, checked before a run starts.

A run against a wrong or absent target should fail in a second with the reason, not after
its whole duration with a table of connect errors.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import click

from loadgen.client import Target
from loadgen.workload import Workload

CONNECT_TIMEOUT_S = 5.0


def check_target(url: str, param: str = "--target") -> None:
    """A base URL the client can send to: http(s)://host[:port][/path]."""
    parts = urlsplit(url)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # not a number, or out of 0-65535
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise click.BadParameter(f"{url!r} is not an http:// or https:// URL with a host "
                                 "(and a port from 1 to 65535)", param_hint=param)


def check_reachable(urls: Iterable[str]) -> None:
    """Open (and close) one TCP connection to each distinct host:port; raises
    click.ClickException (exit 1) naming the first that refuses or does not answer."""
    seen = set()
    for url in urls:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if (host, port) in seen:
            continue
        seen.add((host, port))
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise click.ClickException(f"cannot connect to {url} ({host}:{port}): {reason}"
                                       ) from None


def parse_pairs(items: Sequence[str], what: str) -> dict[str, str]:
    """`KEY=VALUE` options (`--arm-target fp8=URL`, `--quality fp8=0.71`) as a mapping."""
    out = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected PRECISION=VALUE, got {item!r}", param_hint=what)
        out[key.strip()] = val.strip()
    return out


def arm_targets(p: Mapping[str, Any], w: Workload, precisions: Sequence[str],
                direct: Mapping[str, str]) -> dict[str, Target]:
    """Per precision: an engine URL given with --arm-target, else the gateway with
    `model@precision` (or the x-wattgate-precision header with --by-header)."""
    out = {}
    for prec in precisions:
        if prec in direct:
            check_target(direct[prec], "--arm-target")
            out[prec] = Target(direct[prec], w.model, w.api)
        elif p["by_header"]:
            out[prec] = Target(p["target"], w.model, w.api, precision_header=prec)
        else:
            out[prec] = Target(p["target"], f"{w.model}@{prec}", w.api)
    return out
