"""The daemons' logging: to stderr, which journald reads with each line's priority when
systemd runs them."""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

_SYSLOG_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
                    logging.CRITICAL: 2}

MAX_MESSAGE = 2000  # characters of one log message; the rest is cut, and counted
# What would end a line or fake one: control characters (C0, DEL, C1), the Unicode line and
# paragraph separators, and lone surrogates (which a UTF-8 stream cannot even write)
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


class _OneLine(logging.Filter):
    """Makes each message one bounded line. Messages quote what containers, engines and
    peers chose (names, labels, reasons): a newline in one would write a forged line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = _UNSAFE.sub(lambda m: ascii(m.group())[1:-1], record.getMessage())
        if len(message) > MAX_MESSAGE:
            message = f"{message[:MAX_MESSAGE]}... ({len(message) - MAX_MESSAGE:,} more)"
        record.msg, record.args = message, None
        return True


class _JournalFormatter(logging.Formatter):
    """'<N>message': journald reads the priority from the prefix and adds its own timestamp."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{_SYSLOG_PRIORITY.get(record.levelno, 6)}>{super().format(record)}"


def log_handler(stream: TextIO) -> logging.Handler:
    """The daemons' handler: one line per message on `stream`, for journald when systemd
    runs them."""
    handler = logging.StreamHandler(stream)
    if os.environ.get("JOURNAL_STREAM"):
        handler.setFormatter(_JournalFormatter("%(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    handler.addFilter(_OneLine())
    return handler


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        handlers=[log_handler(sys.stderr)])


class RateLimitedLog:
    """Logs at most one line per key (a peer, a node) every `interval` seconds: what peers
    cause, they could repeat to flood the log. The next line logged for a key counts the
    ones held back since. At most `max_keys` keys are told apart; beyond, the rest share
    one."""

    def __init__(self, logger: logging.Logger, interval: float = 60.0, max_keys: int = 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._clock = clock
        self.interval = interval
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self._keys: dict[str, tuple[float, int]] = {}  # key: (when last logged, held back)

    def log(self, level: int, key: str, message: str, *args: object,
            exc_info: bool = False) -> None:
        now = self._clock()
        with self._lock:
            if key not in self._keys and len(self._keys) >= self.max_keys:
                self._keys = {k: v for k, v in self._keys.items()
                              if now - v[0] < self.interval}
                if len(self._keys) >= self.max_keys:
                    key = "(others)"
            last, held = self._keys.get(key, (-math.inf, 0))
            if now - last < self.interval:
                self._keys[key] = (last, held + 1)
                return
            self._keys[key] = (now, 0)
        if held:
            message += f" (and {held:,} more like it held back since the last)"
        self._log.log(level, message, *args, exc_info=exc_info)
