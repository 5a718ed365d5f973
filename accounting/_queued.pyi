from typing import Any

class QueuedPrompts:
    def __init__(self, *, chunk_tokens: float, min_chunk_step_s: float, queued_steps: float,
                 memory_s: float, same_step_s: float, mismatch_steps: float, look_back: int,
                 block: int) -> None: ...
    def place(self, rec: Any, rate: float, /) -> list[tuple[float, float, float]] | None: ...
