"""A one-line progress bar: redrawn in place on a terminal, a line per step elsewhere
(a log, or the guest's output streamed back)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 30


class Progress:
    def __init__(self, total: int, stream: TextIO = sys.stderr) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream
        self.start = time.monotonic()
        self.tty = stream.isatty()

    def step(self, label: str) -> None:
        """Say what starts now (the bar shows what is done)."""
        filled = WIDTH * self.done // self.total
        line = (f"[{'#' * filled}{'.' * (WIDTH - filled)}] {self.done}/{self.total} "
                f"{time.monotonic() - self.start:5.0f}s  {label}")
        if self.tty:
            self.stream.write(f"\r\x1b[K{line}")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self.done += 1

    def close(self, label: str = "done") -> None:
        self.done = self.total
        self.step(label)
        if self.tty:
            self.stream.write("\n")
