"""Guest side of the pytest routing: a plugin that appends one JSON line per finished test
to a results file the host reads through the control share.

Each line: {"nodeid", "outcome" (passed, failed, skipped, xfailed), "duration",
"reason" (skip or xfail reason), "crash" (one-line failure summary), "longrepr" (failure
text), "sections" (captured output, on failure)}.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

RESULTS_ENV = "DQOES_GUEST_RESULTS"


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
