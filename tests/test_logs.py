"""The daemons' log lines (logs.py): whatever a message quotes, it stays one bounded line."""

from __future__ import annotations

import io
import logging

import pytest

from dqoes_cg.logs import MAX_MESSAGE, RateLimitedLog, log_handler


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


def test_a_rate_limited_log_says_how_many_it_held_back(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    limited = RateLimitedLog(logging.getLogger("test_rate_limited"), 60.0, max_keys=2,
                             clock=lambda: now[0])
    with caplog.at_level(logging.INFO):
        for _ in range(1000):
            limited.log(logging.WARNING, "peer1", "from %s", "peer1")
        limited.log(logging.WARNING, "peer2", "from %s", "peer2")
        for peer in ("peer3", "peer4"):  # past max_keys: sharing one line
            limited.log(logging.WARNING, peer, "from %s", peer)
        now[0] = 61.0
        limited.log(logging.WARNING, "peer1", "from %s", "peer1")
    assert caplog.messages == ["from peer1", "from peer2", "from peer3",
                               "from peer1 (and 999 more like it held back since the last)"]
