"""Reading one YAML mapping into typed fields, with errors that name the field path.

`FieldReader` reads values one by one; `section()` reads a whole flat dataclass, taking each
default from the dataclass field and each string's allowed values from its `Literal` type, so
neither is written a second time in a parser. Every config module (gateway, tenancy,
accounting) reads through this one; it imports nothing of ours but the error type.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from core.errors import ConfigError

_Word = TypeVar("_Word", bound=str)

MAX_INTEGER = 2**63 - 1


class FieldReader:
    """Reads one mapping of the YAML tree, remembering its path for error messages."""

    def __init__(self, data: Any, path: str):
        if not isinstance(data, Mapping):
            raise ConfigError(path or "<root>", f"expected a mapping, got {type(data).__name__}")
        self.data = data
        self.path = path
        self.used: set[str] = set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        return self.data.get(key, default)

    def text(self, key: str, default: str | None = None) -> str:
        value = self.get(key, default)
        if value is None:
            raise ConfigError(self.at(key), "is required")
        if not isinstance(value, str) or not value:
            raise ConfigError(self.at(key), "must be a non-empty string")
        return value

    def name(self, key: str, default: str | None = None) -> str:
        """A name the ledger and the metrics carry (a tenant's, a model's, an endpoint's):
        printable, so no NUL (PostgreSQL's text refuses it: every ledger batch holding such a
        request would fail), newline or lone surrogate (no line or JSON encodes it)."""
        value = self.text(key, default)
        if not value.isprintable():
            raise ConfigError(self.at(key), f"{value!r} holds a control or unprintable character")
        return value

    def choice(self, key: str, allowed: tuple[_Word, ...], default: _Word | None = None) -> _Word:
        """One of `allowed` (typed as narrowly as `allowed` is: a Literal's values give it)."""
        value = self.text(key, default)
        for word in allowed:
            if word == value:
                return word
        raise ConfigError(self.at(key), f"{value!r} is not one of {', '.join(allowed)}")

    def number(self, key: str, default: float | None, *, minimum: float = 0.0,
            inclusive: bool = False) -> float:
        """A number > minimum (>= minimum when inclusive)."""
        value = self.get(key, default)
        if value is None:
            raise ConfigError(self.at(key), "is required")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(self.at(key), "must be a finite number")
        if value < minimum or (value == minimum and not inclusive):
            raise ConfigError(self.at(key), f"must be {'>=' if inclusive else '>'} {minimum:g}")
        return float(value)

    def opt_number(self, key: str, *, inclusive: bool = False) -> float | None:
        if self.get(key) is None:
            return None
        return self.number(key, None, inclusive=inclusive)

    def integer(self, key: str, default: int | None, *, minimum: int = 1) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.at(key), "must be an integer")
        if value < minimum:
            raise ConfigError(self.at(key), f"must be >= {minimum}")
        if value > MAX_INTEGER:  # nothing downstream (JSON, SQL) holds more than 64 bits
            raise ConfigError(self.at(key), f"must be at most {MAX_INTEGER}")
        return value

    def flag(self, key: str, default: bool | None) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(self.at(key), "must be true or false")
        return value

    def sub(self, key: str) -> FieldReader:
        """The mapping at `key`, empty when absent or null; anything else that is not a
        mapping is refused (`journal: false` or `shared_store: false` would otherwise read as
        an empty section: every default, the journal and the shared store on)."""
        value = self.get(key)
        return FieldReader({} if value is None else value, self.at(key))

    def items(self, key: str, *, required: bool = True) -> list[tuple[str, Any]]:
        value = self.get(key)
        if value is None and not required:
            return []
        if not isinstance(value, list) or (required and not value):
            raise ConfigError(self.at(key), "must be a non-empty list")
        return [(f"{self.at(key)}[{i}]", item) for i, item in enumerate(value)]

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise ConfigError(self.at(str(unknown[0])), "unknown field")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def secret_hash(r: FieldReader, env: Mapping[str, str], prefix: str, *, required: bool) -> str:
    """A key given as `<prefix>_env` (env var name) or `<prefix>_sha256` (hex digest)."""
    env_name = r.get(f"{prefix}_env")
    digest = r.get(f"{prefix}_sha256")
    if env_name and digest:
        raise ConfigError(r.at(f"{prefix}_env"), f"give {prefix}_env or {prefix}_sha256, not both")
    if digest:
        if not isinstance(digest, str) or len(digest) != 64:
            raise ConfigError(r.at(f"{prefix}_sha256"), "must be 64 hex digits (sha256)")
        try:
            int(digest, 16)
        except ValueError:
            raise ConfigError(r.at(f"{prefix}_sha256"), "must be 64 hex digits") from None
        return digest.lower()
    if env_name:
        if not isinstance(env_name, str):
            raise ConfigError(r.at(f"{prefix}_env"), "must be an environment variable name")
        value = env.get(env_name)
        if not value:
            raise ConfigError(r.at(f"{prefix}_env"), f"environment variable {env_name} is unset")
        return hash_key(value)
    if required:
        raise ConfigError(r.at(f"{prefix}_env"), f"one of {prefix}_env or {prefix}_sha256 is required")
    return ""


def postgres_url(path: str, value: Any) -> str:
    """A PostgreSQL URL as asyncpg reads it: its scheme, and every host's port a number (a
    URL asyncpg cannot parse would fail the gateway's start with a traceback, not here)."""
    if not isinstance(value, str) or not value.startswith(("postgresql://", "postgres://")):
        raise ConfigError(path, "must be a PostgreSQL URL (postgresql://...)")
    try:
        for host in urlsplit(value).netloc.rpartition("@")[2].split(","):
            port = host.rpartition("]")[2].partition(":")[2]  # after an IPv6 literal's ]
            if port and not (port.isdigit() and 0 < int(port) < 65536):
                raise ValueError(f"port {port!r} is not a number from 1 to 65535")
    except ValueError as exc:
        raise ConfigError(path, f"not a PostgreSQL URL: {exc}") from None
    return value


def default_of(cls: type[Any], name: str) -> Any:
    """The default a dataclass declares for one field (its factory called, if it has one)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            default = _field_default(f)
            if default is dataclasses.MISSING:
                raise TypeError(f"{cls.__name__}.{name} has no default")
            return default
    raise TypeError(f"{cls.__name__} has no field {name!r}")


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def literal_values(hint: Any) -> tuple[str, ...] | None:
    """The allowed strings of a `Literal[...]` type, else None."""
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else None


_Section = TypeVar("_Section")


def section(r: FieldReader, cls: type[_Section], *, minimums: Mapping[str, float] | None = None,
            given: Mapping[str, Any] | None = None) -> _Section:
    """A flat config section read into its dataclass, each default and each vocabulary written
    once (in the dataclass): numbers are > 0 and integers >= 1 unless `minimums` gives an
    inclusive lower bound; a `Literal`-typed field accepts only its values; other strings must
    be non-empty. Fields in `given` were read by the caller (lists, mappings) and are taken
    as they are. Unknown keys are refused, naming the field."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = dict(given or {})
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in values:
            values[f.name] = _read_field(r, f, hints[f.name], (minimums or {}).get(f.name))
    r.finish()
    return cls(**values)


def _read_field(r: FieldReader, f: dataclasses.Field[Any], hint: Any, low: float | None) -> Any:
    """One field of `section()`, by its type; a field without a default is required."""
    default = _field_default(f)
    default = None if default is dataclasses.MISSING else default
    allowed = literal_values(hint)
    if hint is bool:
        return r.flag(f.name, default)
    if hint is int:
        return r.integer(f.name, default, minimum=int(1 if low is None else low))
    if hint is float:
        return r.number(f.name, default, minimum=low or 0.0, inclusive=low is not None)
    if allowed is not None:
        return r.choice(f.name, allowed, default)
    if hint is str:
        return r.text(f.name, default)
    raise TypeError(f"section() reads bool, int, float, str and Literal fields; "
                    f"read {f.name} first and pass it in `given`")
