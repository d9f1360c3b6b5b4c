"""Guest side of the pytest routing: a plugin that appends one JSON line per finished test
to a results file the host reads through the control share, and one that fails a test
that runs past a time limit, so that one hung test cannot hold the rest of the session.

Each line: {"nodeid", "outcome" (passed, failed, skipped, xfailed), "duration",
"reason" (skip or xfail reason), "crash" (one-line failure summary), "longrepr" (failure
text), "sections" (captured output, on failure), "properties" (the test's record_property)}.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

RESULTS_ENV = "DQOES_GUEST_RESULTS"
TEST_LIMIT_ENV = "DQOES_GUEST_TEST_LIMIT"  # seconds one test may take in a guest
DEFAULT_TEST_LIMIT = 1200.0  # the longest test takes about 5 minutes on a loaded host


class ResultWriter:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._pending: dict[str, dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        result = self._pending.setdefault(
            report.nodeid,
            {"nodeid": report.nodeid, "outcome": "passed", "duration": 0.0, "reason": "",
             "crash": "", "longrepr": "", "sections": []},
        )
        result["duration"] += report.duration
        result["properties"] = [[k, v] for k, v in report.user_properties]
        if result["outcome"] == "passed":  # the first phase that did not pass decides
            if report.failed:
                phase = "" if report.when == "call" else f"error in {report.when}: "
                crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", "")
                result.update(outcome="failed", crash=phase + crash,
                              longrepr=report.longreprtext, sections=report.sections)
            elif report.skipped:
                result.update(_skip_outcome(report))
        if report.when == "teardown":
            self._write(self._pending.pop(report.nodeid))

    def _write(self, result: dict[str, Any]) -> None:
        with self._path.open("a") as f:
            f.write(json.dumps(result) + "\n")


def _skip_outcome(report: pytest.TestReport) -> dict[str, str]:
    if hasattr(report, "wasxfail"):
        return {"outcome": "xfailed", "reason": report.wasxfail}
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return {"outcome": "skipped", "reason": reason.removeprefix("Skipped: ")}


class TestTimeLimitExceeded(Exception):
    """A test ran past the guest's limit for one test."""


class TimeLimit:
    """Fails a test whose setup, call and teardown together last more than `seconds` (real
    time, SIGALRM in the main thread). The failure shows where every thread of the test
    process was and which processes it had started, with their state and what they waited
    for in the kernel: what a hang needs to be understood. A main thread stuck where no
    signal handler runs (a lock taken in C) cannot be failed: a minute later faulthandler
    writes every thread's stack to the guest's stderr, which the host shows when the
    session's own time runs out."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        # stderr as it is now, before pytest captures the tests' output into its own files
        self._stderr = os.fdopen(os.dup(sys.__stderr__.fileno()), "w")

    @classmethod
    def from_environment(cls) -> TimeLimit:
        return cls(float(os.environ.get(TEST_LIMIT_ENV, DEFAULT_TEST_LIMIT)))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        previous = signal.signal(signal.SIGALRM, self._expired)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        faulthandler.dump_traceback_later(self.seconds + 60, file=self._stderr)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    def _expired(self, _signum: int, _frame: FrameType | None) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)  # the rest of this test runs unbounded no more
        raise TestTimeLimitExceeded(
            f"the test ran past {self.seconds:.0f} s, the limit for one test in the guest\n"
            f"{thread_stacks()}\n{descendants()}")


def thread_stacks() -> str:
    """Where the process's other threads are (this one's is the failure's traceback)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(
        [f"--- thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame))}"
         for ident, frame in sys._current_frames().items() if ident != threading.get_ident()]
        or ["--- no other thread"])


def descendants() -> str:
    """This process's descendants: pid, state, kernel wait channel, command line."""
    procs: dict[int, tuple[int, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            wchan = Path(entry.path, "wchan").read_text()
            cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        procs[int(entry.name)] = (int(fields[1]), f"{fields[0]} {wchan or '-'} {cmd[:200]}")
    ours, lines = {os.getpid()}, []
    for pid in sorted(procs):  # a child's pid is almost always above its parent's
        if procs[pid][0] in ours:
            ours.add(pid)
            lines.append(f"{pid} (parent {procs[pid][0]}): {procs[pid][1]}")
    return "--- processes it started (pid, state, wait channel, command):\n" + (
        "\n".join(lines) or "(none)")
