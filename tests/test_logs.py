"""The daemons' log lines (logs.py): whatever a message quotes, it stays one bounded line."""

from __future__ import annotations

import io
import logging

from dqoes_cg.logs import MAX_MESSAGE, log_handler


def test_a_message_quoting_hostile_text_stays_one_bounded_line() -> None:
    out = io.StringIO()
    log = logging.getLogger("test_logs")
    log.propagate = False
    log.addHandler(log_handler(out))
    try:
        forged = "web\n2026-01-01 00:00:00,000 INFO web: target removed\r\u2028\x1b[2J\udcff"
        log.warning("%s: labels refused", forged)
        log.warning("%s", "x" * (MAX_MESSAGE * 10))
    finally:
        log.handlers.clear()
    first, second = out.getvalue().splitlines()
    assert first.endswith("web\\n2026-01-01 00:00:00,000 INFO web: target removed\\r\\u2028"
                          "\\x1b[2J\\udcff: labels refused")
    assert len(second) < MAX_MESSAGE + 100 and second.endswith(f"({MAX_MESSAGE * 9:,} more)")
