"""Pages of a status or a listing: a bounded number of entries, in the order of their
names, and a cursor to the next page.

A request asks for a page with either or both of `limit` (at most MAX_LIMIT entries; null:
DEFAULT_LIMIT) and `cursor`, the `next` of the page before (null: from the first); the
reply's `next` is null after the last page. The cursor holds the name of the last entry
shown, and a page holds the entries named after it: an entry added or removed between two
pages neither repeats one nor shifts the others (an entry added before the cursor is not
shown, as it came after that page was made), and a cursor stays good across a restart of
the daemon. A request with neither is answered whole, as before paging existed: clients of
protocol version 1 that know nothing of pages get what they always got.

Imports no numpy: dqoesctl reads it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

DEFAULT_LIMIT = 500
MAX_LIMIT = 2000  # a page of status is 0.7-0.85 KB an entry: 1.7 MB at most
CURSOR_PREFIX = "n1:"  # by name, the first format: another order would have another
MAX_CURSOR = len(CURSOR_PREFIX) + 4096


class PageError(ValueError):
    """A limit or cursor refused; the message is one line, for the client."""


@dataclass(frozen=True)
class Page:
    after: str | None  # the entries named after this one (None: from the first)
    limit: int


def page_of(req: dict[str, Any]) -> Page | None:
    """The page `req` asks for (None: the whole of it); PageError if it asks for none that
    can be given."""
    if "limit" not in req and "cursor" not in req:
        return None
    limit, cursor = req.get("limit"), req.get("cursor")
    if limit is None:
        limit = DEFAULT_LIMIT
    elif type(limit) is not int or not 1 <= limit <= MAX_LIMIT:
        raise PageError(f"limit must be a whole number from 1 to {MAX_LIMIT}, "
                        f"not {limit!r:.40}")
    if cursor is None:
        return Page(None, limit)
    if (not isinstance(cursor, str) or not cursor.startswith(CURSOR_PREFIX)
            or len(cursor) > MAX_CURSOR):
        raise PageError(f"cursor {cursor!r:.60} is not one this daemon gives: pass the "
                        "'next' of the page before, or none for the first page")
    return Page(cursor[len(CURSOR_PREFIX):], limit)


def cursor_after(name: str) -> str:
    """The cursor to the entries named after `name`."""
    return CURSOR_PREFIX + name


T = TypeVar("T")


def take(names: Sequence[str], items: Sequence[T], page: Page) -> tuple[list[T], str | None]:
    """The items of `page` and the cursor to the next (None: none after), of `items` in
    the order of their `names` (sorted)."""
    start = 0 if page.after is None else bisect_right(names, page.after)
    end = start + page.limit
    shown = list(items[start:end])
    return shown, cursor_after(names[end - 1]) if end < len(names) else None
