"""JSON lines: one JSON object per line, bounded, the framing of the control socket
(control.py) and of the cluster's channel (cluster/protocol.py). What comes in is hostile:
a line too long, not JSON, or not an object is a ValueError with a one-line reason."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

SPLIT_DEPTH = 2
"""`encode_in_parts` makes objects above this depth a member at a time, and lists at it or
above an item at a time."""


class Encoded:
    """JSON text made already (a reply's result shared by several clients' replies):
    `encode_in_parts` puts it in as is; anything else refuses it (TypeError)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def encode(doc: Mapping[str, Any]) -> bytes:
    """`doc` on one line, compact, with its newline."""
    return dumps(doc).encode() + b"\n"


def encode_in_parts(doc: Mapping[str, Any]) -> bytes:
    """What `encode` makes, made in pieces (each item of a list near the top, such as each
    container of a status, in a call of its own): a thread that encodes a reply of
    megabytes lets the others run between pieces, where one call holds the interpreter's
    lock throughout."""
    return (text_in_parts(doc) + "\n").encode()


def text_in_parts(doc: Any) -> str:
    """The JSON text of `doc`, made in pieces as `encode_in_parts` makes it."""
    return "".join(_parts(doc, 0))


def _parts(obj: Any, depth: int) -> Iterator[str]:
    if isinstance(obj, Encoded):
        yield obj.text
    elif isinstance(obj, dict) and depth < SPLIT_DEPTH and all(isinstance(k, str) for k in obj):
        yield "{"
        for k, (key, value) in enumerate(obj.items()):
            yield ("," if k else "") + dumps(key) + ":"
            yield from _parts(value, depth + 1)
        yield "}"
    elif isinstance(obj, list) and depth <= SPLIT_DEPTH:
        yield "["
        for k, item in enumerate(obj):
            yield ("," if k else "") + dumps(item)
        yield "]"
    else:
        yield dumps(obj)


def dumps(obj: Any) -> str:
    """`obj` as compact JSON text (no newline)."""
    return json.dumps(obj, separators=(",", ":"))


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
