"""Where accounting's roles run, decided once per process by `accounting_mode`.

Accounting has two roles a process may take (docs/operations.md, "Where the apportioner
runs"): recording (finished requests written to the ledger, journal first) and apportioning
(the engines' meters read, their energy split over the requests). Which a process takes
follows from the config (`accounting.enabled`, `accounting.apportioner`) and from how the
process was launched:

| launched by | `apportioner` | records | apportions |
| --- | --- | --- | --- |
| `wattgate serve` | `process` | child | child |
| `wattgate serve` | `external` | child | elsewhere |
| `wattgate serve` | `inline` | here | here |
| code (`build_app` alone: tests, embedding) | `process`, `inline` | here | here |
| code | `external` | here | elsewhere |
| `wattgate apportioner --records-fd N` | any | here | here |
| `wattgate apportioner --records-fd N --record-only` | any | here | elsewhere |
| `wattgate apportioner` | any | elsewhere | here |
| any, accounting off | | nowhere | nowhere |

The commands call `accounting_mode` as they load the config and pass the result on: to the
gateway's app, to the accounting service, to the child (its flags, from `child`). Nothing
else reads `accounting.apportioner` or `accounting.enabled` to decide a role.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from accounting.config import AccountingConfig
from core.errors import ConfigError

# here: this process; child: the accounting child this gateway starts; elsewhere: another
# process (another replica's gateway, a `wattgate apportioner` of its own); nowhere: off
Place = Literal["here", "child", "elsewhere", "nowhere"]
# how the process was started: `wattgate serve`, `build_app` from code, `wattgate apportioner`
Launch = Literal["serve", "code", "apportioner"]
LAUNCHES: tuple[Launch, ...] = get_args(Launch)


@dataclass(frozen=True, slots=True)
class AccountingMode:
    """Where this process's finished requests are recorded (`records`; for the accounting
    child: whether it records its gateway's) and where the engines' energy is apportioned
    (`apportions`)."""

    records: Place
    apportions: Place

    @property
    def enabled(self) -> bool:
        """Accounting is on: this process's requests are recorded somewhere."""
        return self.records != "nowhere"

    @property
    def records_here(self) -> bool:
        return self.records == "here"

    @property
    def apportions_here(self) -> bool:
        return self.apportions == "here"

    @property
    def child(self) -> AccountingMode | None:
        """The mode of the accounting child this gateway starts; None: it starts none."""
        if self.records != "child":
            return None
        return AccountingMode("here", "here" if self.apportions == "child" else "elsewhere")

    def child_flags(self) -> list[str]:
        """This mode as the flags of `wattgate apportioner` for a child (it records through
        `--records-fd`); the child reads them back with `accounting_mode`."""
        assert self.records == "here", "a child records its gateway's requests"
        return [] if self.apportions_here else ["--record-only"]


OFF = AccountingMode("nowhere", "nowhere")
INLINE = AccountingMode("here", "here")
RECORDER_ONLY = AccountingMode("here", "elsewhere")
APPORTIONER_ONLY = AccountingMode("elsewhere", "here")


def accounting_mode(config: AccountingConfig | None, launch: Launch, *,
                    records_fd: bool = False, record_only: bool = False) -> AccountingMode:
    """The accounting mode of a process launched by `launch` with the `accounting:` section
    `config` (None: absent). `records_fd` and `record_only`: the `wattgate apportioner`
    flags (a gateway's records arrive on a socket; only record them). Raises ConfigError
    where the combination cannot run: an apportioner without accounting, `--record-only`
    without `--records-fd`, those flags on another command."""
    if launch != "apportioner" and (records_fd or record_only):
        raise ConfigError("--records-fd", "only `wattgate apportioner` records a gateway's "
                          "requests from a socket")
    if config is None or not config.enabled:
        if launch == "apportioner":
            raise ConfigError("accounting", "the apportioner needs accounting enabled")
        return OFF
    if launch == "apportioner":
        if record_only and not records_fd:
            raise ConfigError("--record-only", "needs --records-fd")
        return AccountingMode("here" if records_fd else "elsewhere",
                              "elsewhere" if record_only else "here")
    where = config.apportioner
    if where == "inline":
        return INLINE
    if launch == "serve":  # `wattgate serve` starts the accounting child
        return AccountingMode("child", "child" if where == "process" else "elsewhere")
    # an app built in code starts no child: it records itself, and apportions itself unless
    # an apportioner runs elsewhere
    return AccountingMode("here", "here" if where == "process" else "elsewhere")
