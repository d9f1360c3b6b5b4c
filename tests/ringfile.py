"""Hand-made ring contents for the ring tests: the format written from its description in
docs/ring-format.md, independently of the C code, as a well-behaved or a broken producer
would."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

HEADER = 256
SLOT = 32
COUNTER_AT = 64
MASK = (1 << 64) - 1


def check(seq: int, end_ns: int, latency_ns: int) -> int:
    """The slot check word, as docs/ring-format.md defines it."""
    h = ((seq * 0x9E3779B97F4A7C15) & MASK) ^ end_ns
    h = ((h * 0xBF58476D1CE4E5B9) & MASK) ^ latency_ns
    h = (h * 0x94D049BB133111EB) & MASK
    return h ^ (h >> 31)


class RawWriter:
    """Writes slots and counters by hand, as a (possibly broken) producer would."""

    def __init__(self, path: Path, capacity: int) -> None:
        self.path, self.capacity = path, capacity

    def counter(self) -> int:
        return struct.unpack("<Q", self._pread(8, COUNTER_AT))[0]

    def set_counter(self, value: int) -> None:
        self._pwrite(struct.pack("<Q", value), COUNTER_AT)

    def claim(self) -> int:
        pos = self.counter()
        self.set_counter((pos + 1) & MASK)
        return pos

    def publish(self, pos: int, latency_ns: int, end_ns: int | None = None) -> None:
        end = time.monotonic_ns() if end_ns is None else end_ns
        seq = (pos + 1) & MASK
        slot = struct.pack("<4Q", seq, end, latency_ns, check(seq, end, latency_ns))
        self._pwrite(slot, HEADER + (pos % self.capacity) * SLOT)

    def record(self, latency_ns: int, end_ns: int | None = None) -> None:
        self.publish(self.claim(), latency_ns, end_ns)

    def _pread(self, n: int, at: int) -> bytes:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            return os.pread(fd, n, at)
        finally:
            os.close(fd)

    def _pwrite(self, data: bytes, at: int) -> None:
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.pwrite(fd, data, at)
        finally:
            os.close(fd)
