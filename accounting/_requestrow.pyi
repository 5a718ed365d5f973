from typing import Any

def request_row(cls: type[Any], rec: Any, interval_s: float, replica: str,
                work: list[Any]) -> Any: ...
