"""Durations as people write them: '250us', '40ms', '1.5s' (dqoesctl's arguments, container
labels), and back."""

from __future__ import annotations

import math
import re

_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
RESOLUTION_S = 1e-6  # what cpu.max and `format_duration` resolve: a shorter target is none
# ASCII digits only: float() takes any script's digits (Arabic-Indic, fullwidth, bold)
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(us|µs|ms|s)\s*$", re.ASCII)


def parse_duration(text: str) -> float:
    """'40ms' -> 0.04. A unit is required: a bare number is too easy to get wrong."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"bad duration {text[:40]!r}: use a number and a unit "
                         "(250us, 40ms, 1.5s)")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if not math.isfinite(seconds) or round(seconds / RESOLUTION_S) < 1:
        raise ValueError(f"bad duration {text[:40]!r}: must be at least 1us")
    return seconds


def format_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    magnitude = abs(seconds)
    if magnitude >= 1:
        return f"{seconds:.2f}s"
    if magnitude >= 1e-3:
        return f"{seconds * 1e3:.1f}ms"
    return f"{seconds * 1e6:.0f}us"
