"""The engines package's subcommands: `engines` (launch specs, launch) and `agent`.

`wattgate sim` lives beside the simulator, in engines/sim/cli.py.
"""

from __future__ import annotations
