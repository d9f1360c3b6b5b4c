"""Work counted, not timed: the function calls a piece of code makes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def operations(call: Callable[[], object]) -> int:
    """Python and C function calls made by `call()` in this thread: its work, whatever the
    machine's speed."""
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        count += event in ("call", "c_call")

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return count
