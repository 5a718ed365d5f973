"""`wattgate serve` under cProfile, switched on and off by signals (bench/nonstream_profile.py).

    python bench/overhead/cprofile_serve.py OUT.prof serve --config ... --port ...

SIGUSR1 starts profiling the event-loop thread, SIGUSR2 stops it and writes OUT.prof, so the
profile covers a load window only (not start-up nor the idle time after it).
"""

from __future__ import annotations

import sys

# run as a script, its folder leads sys.path, and its profile.py would shadow the stdlib's
sys.path.pop(0)

import cProfile
import signal
from types import FrameType


def main() -> None:
    out, argv = sys.argv[1], sys.argv[2:]
    prof = cProfile.Profile()

    def start(signum: int, frame: FrameType | None) -> None:
        prof.enable()

    def stop(signum: int, frame: FrameType | None) -> None:
        prof.disable()
        prof.dump_stats(out)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    import wattgate_cli

    sys.argv = ["wattgate", *argv]
    wattgate_cli.main()


if __name__ == "__main__":
    main()
