"""The node's pressure stall information (/proc/pressure/cpu, memory, io): how much of the
last window some task of the node stalled on each resource, and the kernel's avg10.

Read at each decision window (three small reads, not per container), each file opened
without following a symlink and read into a bounded buffer, its "some" line parsed by the
C parser the containers' pressure files go through (csrc/cgtable.c). A file that cannot be
read or parsed gives NaN for that resource and one log line per distinct reason.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

from ._native import ffi, lib
from .cgtable import PSI_RESOURCES

log = logging.getLogger(__name__)

PROC_PRESSURE = Path("/proc/pressure")
MAX_BYTES = 512  # two lines of about 70 bytes


def read_some(path: Path) -> tuple[int, float]:
    """The "some" line of the pressure file `path`: (total stalled µs, avg10 in percent).
    OSError, or ValueError for content that is not a pressure file's."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        data = os.read(fd, MAX_BYTES)
    finally:
        os.close(fd)
    if len(data) >= MAX_BYTES:
        raise ValueError(f"more than {MAX_BYTES - 1} bytes")
    total, avg10 = ffi.new("uint64_t *"), ffi.new("uint32_t *")
    if lib.dq_psi_parse_some(data, len(data), total, avg10) != 0:
        raise ValueError("malformed content")
    return int(total[0]), avg10[0] / 100


class NodePressure:
    """The node's stalls over the last window, a value per PSI_RESOURCES (NaN: unknown)."""

    def __init__(self, root: Path = PROC_PRESSURE) -> None:
        self.root = root
        self.share = [math.nan] * len(PSI_RESOURCES)  # of the window, some task stalled
        self.avg10 = [math.nan] * len(PSI_RESOURCES)  # percent
        self._total: list[int | None] = [None] * len(PSI_RESOURCES)
        self._at: float | None = None
        self._logged: set[str] = set()

    def sample(self, now: float) -> None:
        """Closes the window that started at the last sample (`now`: monotonic seconds)."""
        elapsed = None if self._at is None else max(now - self._at, 1e-3)
        self._at = now
        for r, resource in enumerate(PSI_RESOURCES):
            path = self.root / resource
            try:
                total, avg10 = read_some(path)
            except (OSError, ValueError) as e:
                why = f"{path}: {e.strerror if isinstance(e, OSError) and e.strerror else e}"
                if why not in self._logged:
                    self._logged.add(why)
                    log.warning("node pressure unknown: %s", why)
                self.share[r] = self.avg10[r] = math.nan
                self._total[r] = None
                continue
            last = self._total[r]
            self.share[r] = math.nan if last is None or elapsed is None or total < last \
                else min((total - last) / 1e6 / elapsed, 1.0)
            self.avg10[r] = avg10
            self._total[r] = total
