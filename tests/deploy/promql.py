"""Metric names and label matchers used by PromQL expressions (dashboards, alert rules).

Not a PromQL parser: it removes what cannot be a metric name (strings, grouping label lists,
range selectors, numbers, function calls, keywords, Grafana variables) and reads what is left.
"""

from __future__ import annotations

import re

_GRAFANA_VAR = re.compile(r"\$\{?\w+\}?")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_BRACES = re.compile(r"\{[^}]*\}")
_NUMBER = re.compile(r"(?<![\w:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                      "and", "or", "unless", "offset", "inf", "nan", "atan2"})


def _clean(expr: str) -> str:
    expr = _GRAFANA_VAR.sub("5m", expr)
    expr = _STRING.sub('""', expr)
    expr = _GROUPING.sub(" ", expr)
    return _RANGE.sub("", expr)


def selectors(expr: str) -> list[tuple[str, frozenset[str]]]:
    """(metric, label names matched) for every `metric{...}` selector in expr."""
    return [(m.group(1), frozenset(_MATCHER.findall(m.group(2))))
            for m in _SELECTOR.finditer(_clean(expr)) if m.group(1) not in KEYWORDS]


def metric_names(expr: str) -> set[str]:
    """Every metric name expr reads."""
    text = _NUMBER.sub(" ", _BRACES.sub(" ", _clean(expr)))
    names = set()
    for m in _IDENT.finditer(text):
        rest = text[m.end():].lstrip()
        if m.group(0) in KEYWORDS or rest.startswith("("):
            continue
        names.add(m.group(0))
    return names
