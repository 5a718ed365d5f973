_Row = tuple[str, int, float, float, float, float, float, float]

def streamed_rows(rid: str, times: tuple[float, ...], cum: list[int] | None, total: int,
                  off: float, completion: int, prompt: float, prefill: dict[int, float],
                  attention: dict[int, float], t_disp: float, t_end: float, t_pf: float,
                  k_first: int, k_last: int, interval_s: float, span: bool, k_r0: int,
                  k_rl: int, first: float) -> list[_Row]: ...

def cusum_split(times: tuple[float, ...], cum: list[int] | None, off: float, s: float,
                e: float) -> tuple[int, float, float] | None: ...

def with_heads(rows: list[_Row], times: tuple[float, ...], cum: list[int] | None, off: float,
               interval_s: float, per_event: float, first: float, split_s: float,
               min_shift_events: float
               ) -> list[tuple[str, int, float, float, float, float, float, float, float]]: ...
