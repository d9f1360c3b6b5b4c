"""Running commands and waiting for states in the lab's guests, where everything runs on an
emulated CPU tens of times slower than the host: timeouts are generous, and waits poll for
a state instead of sleeping for a guess."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def sh(*argv: str | Path, timeout: float = 180) -> str:
    """Run a command; its stdout. A failure raises with what it printed."""
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                            timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, argv))} exited {result.returncode}:\n"
                             f"{result.stdout}{result.stderr}")
    return result.stdout


def wait_for(predicate: Callable[[], T], timeout: float, what: str,
             explain: Callable[[], str] = lambda: "", every: float = 2.0) -> T:
    """Poll (each poll costs the emulated CPU that the workload runs on: not too often)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n"
                                 + explain())
        time.sleep(every)
