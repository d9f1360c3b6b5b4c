"""JSON lines: one JSON object per line, bounded, the framing of the control socket
(control.py) and of the cluster's channel (cluster/protocol.py). What comes in is hostile:
a line too long, not JSON, or not an object is a ValueError with a one-line reason."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def encode(doc: Mapping[str, Any]) -> bytes:
    """`doc` on one line, compact, with its newline."""
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """The object on `line` (its newline optional)."""
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise ValueError("is not valid JSON (or nested too deeply)") from None
    if not isinstance(doc, dict):
        raise ValueError("is not a JSON object")
    return doc


def take_line(buffer: bytearray, limit: int) -> bytes | None:
    """The first whole line in `buffer`, without its newline, taken out of it (None: no
    newline yet); ValueError if it is, or would be, longer than `limit` bytes."""
    end = buffer.find(b"\n")
    if end > limit or (end < 0 and len(buffer) > limit):
        raise ValueError(f"is longer than {limit} bytes")
    if end < 0:
        return None
    line = bytes(buffer[:end])
    del buffer[:end + 1]
    return line
