"""Time arguments of chargeback queries: Unix seconds, ISO 8601, or relative (`-2h`, `-30m`)."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_time(text: str, now_s: float) -> float:
    """Seconds since the epoch; raises ValueError naming the accepted forms."""
    text = text.strip()
    m = _RELATIVE.match(text)
    if m:
        return now_s - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise ValueError(f"{text!r} is not a time: use Unix seconds, ISO 8601 or a "
                             "relative time like -2h")
        return value
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r}: use Unix seconds, ISO 8601 or a relative time like -2h"
                         ) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()
