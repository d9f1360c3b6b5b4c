"""Host side of the pytest routing: decide where `kernel` tests run, and stand in for them
with proxy items when they run in the guest.

One guest serves the whole session. It boots at the first proxy item and runs a single
`pytest` over all selected kernel tests; report.py writes each result as a JSON line into
the control share, and each proxy waits for its own line and replays it on the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pytest import Mark

from lab.cgroups import cgroup2_cpu_mount

from .prereqs import missing_guest_packages
from .report import RESULTS_ENV
from .vm import (
    POLL_INTERVAL,
    FileTail,
    Guest,
    GuestBootTimeout,
    GuestConfig,
    GuestError,
    GuestStopped,
)

FORCE_ENV = "DQOES_TEST_GUEST"  # "1": always use the guest; "0": never
TIMEOUT_ENV = "DQOES_GUEST_TIMEOUT"  # seconds for the guest's whole test run
DEFAULT_TIMEOUT = 3300.0  # the guests share the host's CPUs with whatever else runs there: the
#                           end-to-end guest's tests took 44 min beside two busy loops
IN_GUEST_ENV = "DQOES_GUEST"


@dataclass(frozen=True)
class Route:
    """Where kernel tests go: "host", "guest" or "skip", and why."""

    where: str
    reason: str


def choose_route() -> Route:
    force = os.environ.get(FORCE_ENV, "")
    if os.environ.get(IN_GUEST_ENV) == "1":
        return Route("host", "this is the test guest")
    if force != "1" and cgroup2_cpu_mount() is not None:
        return Route("host", "this host has cgroup v2 with the cpu controller")
    why = f"{FORCE_ENV}=1" if force == "1" else "no cgroup v2 cpu controller on this host"
    if force == "0":
        return Route("skip", f"{why} and {FORCE_ENV}=0")
    missing = missing_guest_packages()
    if missing:
        return Route(
            "skip",
            f"{why}, and no test guest: missing Debian packages {' '.join(missing)} "
            "(run lab/guest/install-deps)",
        )
    return Route("guest", why)


def choose_own_guest_route(own_env: str, guest: str, missing: Callable[[], list[str]],
                           why: str) -> Route:
    """Where tests go that run only in a guest of their own kind (`guest`, whose pytest has
    `own_env`=1, and which this host cannot boot while `missing` names packages)."""
    if os.environ.get(own_env) == "1":
        return Route("host", f"this is the {guest}")
    if os.environ.get(IN_GUEST_ENV) == "1":
        return Route("skip", f"needs the {guest}, not this one")
    if os.environ.get(FORCE_ENV) == "0":
        return Route("skip", f"{FORCE_ENV}=0")
    lacking = missing()
    if lacking:
        return Route("skip", f"no {guest}: missing {', '.join(lacking)} "
                             "(`make deps` installs them)")
    return Route("guest", why)


# Markers the guest has already evaluated; the host must not evaluate them again.
_GUEST_DECIDES = frozenset({"skip", "skipif", "xfail"})


class GuestRebootWarning(UserWarning):
    """A guest stopped as a whole and a new one took over its tests."""


class GuestTestFailure(Exception):
    """A kernel test failed in the guest; the message is the guest's failure text."""


class GuestProxy(pytest.Item):
    """Stands for one kernel test (same node id) and replays its result from the guest."""

    def __init__(self, *, original: pytest.Item, runner: Runner, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.runner = runner
        self._location = original.reportinfo()
        self.own_markers.extend(original.own_markers)
        self.keywords.update(original.keywords)

    def iter_markers_with_node(self, name: str | None = None) -> Iterator[tuple[Any, Mark]]:
        for node, mark in super().iter_markers_with_node(name):
            if mark.name not in _GUEST_DECIDES:
                yield node, mark

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self._location

    def runtest(self) -> None:
        result = self.runner.result(self.nodeid)
        self.user_properties.append(("guest_duration", result["duration"]))
        self.user_properties.extend((k, v) for k, v in result.get("properties", ()))
        outcome = result["outcome"]
        if outcome == "skipped":  # reported at the test's location, like a skip mark
            raise pytest.skip.Exception(f"[guest] {result['reason']}", _use_item_location=True)
        if outcome == "xfailed":
            pytest.xfail(f"[guest] {result['reason']}")
        if outcome == "failed":
            sections = "".join(f"\n{'-' * 20} {title} {'-' * 20}\n{text}"
                               for title, text in result["sections"])
            raise GuestTestFailure(f"[guest] {result['crash']}\n{result['longrepr']}{sections}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if excinfo.errisinstance((GuestTestFailure, GuestError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)


class GuestRunner:
    """Boots the session's guest on first use and hands out the results it reports.

    `prepare`, if given, runs on the host just before the boot and returns variables for the
    guest's environment (what it built for the tests, say)."""

    def __init__(self, rootdir: Path, nodeids: list[str], config: GuestConfig | None = None,
                 prepare: Callable[[], dict[str, str]] | None = None) -> None:
        self._rootdir = rootdir
        self.nodeids = tuple(nodeids)  # the tests it runs
        self._to_run = list(nodeids)  # what the guest runs (after a reboot, the rest)
        self._config = config or GuestConfig()
        self._prepare = prepare
        self._prepared: dict[str, str] | None = None
        self._guest: Guest | None = None
        self._results: dict[str, dict[str, Any]] = {}
        self._reported: set[str] = set()
        self._new_results: FileTail | None = None
        self._exit_code: int | None = None
        self._failure: str | None = None
        self._rebooted = False

    def result(self, nodeid: str) -> dict[str, Any]:
        """Wait for the guest's result for `nodeid`. Raises GuestError if the guest died or
        ended without reporting it."""
        if self._guest is None:
            if self._failure is not None:
                raise GuestError(f"the test guest failed earlier: {self._failure}")
            self._start()
        assert self._guest is not None
        while True:
            self._read_results()
            if nodeid in self._results:
                return self._results.pop(nodeid)
            if self._failure is not None:
                raise GuestError(f"the test guest failed earlier: {self._failure}")
            if self._exit_code is not None:
                raise GuestError(
                    f"the guest's pytest exited with {self._exit_code} without a result for "
                    f"{nodeid}; its output ended with:\n{self._output_tail()}"
                )
            try:
                self._exit_code = self._guest.poll()
            except GuestError as e:
                self._read_results()  # it may have reported this test before it failed
                if isinstance(e, GuestStopped | GuestBootTimeout) and not self._rebooted \
                        and self._unreported():
                    self._reboot(e)
                    continue
                self._failure = str(e).splitlines()[0]
                if nodeid in self._results:
                    return self._results.pop(nodeid)
                output = self._output_tail()
                raise GuestError(f"{e}\n--- guest pytest output ---\n{output}") from None
            if self._exit_code is None:
                time.sleep(POLL_INTERVAL)

    def boot(self) -> None:
        """Boots the guest now rather than when a result is first asked for."""
        if self._guest is None and self._failure is None:
            self._start()

    def reported_all(self) -> bool:
        """Whether its guest has reported every one of its tests, without waiting."""
        if self._guest is None:
            return False
        self._read_results()
        return not self._unreported()

    def _unreported(self) -> list[str]:
        return [n for n in self._to_run if n not in self._reported]

    def _reboot(self, e: GuestError) -> None:
        """Once per session, a guest that did not boot or stopped as a whole (the emulator,
        not a test: a hung test is failed in the guest by report.TimeLimit) is replaced by a
        new one that runs the tests it had not reported, the one it stopped in first."""
        assert self._guest is not None
        left = self._unreported()
        warnings.warn(GuestRebootWarning(
            f"{str(e).splitlines()[0]}; a new guest runs the {len(left)} tests it had not "
            f"reported, from {left[0]} on (the stopped guest's files: {self._guest.ctl_dir})"),
            stacklevel=1)
        self.close()
        self._rebooted = True
        self._to_run = left
        self._start()

    def close(self) -> None:
        if self._guest is not None:
            self._guest.close()

    def _start(self) -> None:
        if self._prepared is None:
            try:
                self._prepared = self._prepare() if self._prepare else {}
            except Exception as e:
                self._failure = f"preparing the guest's tests failed: {e}"
                raise GuestError(self._failure) from e
        self._guest = Guest(self._config)
        results = self._guest.ctl_dir / "results.jsonl"
        self._new_results = FileTail(results)
        env = {k: v for k, v in os.environ.items() if k != FORCE_ENV} | self._prepared
        env[RESULTS_ENV] = str(results)
        argv = [sys.executable, "-m", "pytest", "-q", "--color=no", "-p", "no:cacheprovider",
                *self._to_run]
        timeout = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT))
        self._guest.start(argv, cwd=self._rootdir, env=env, run_timeout=timeout)

    def _read_results(self) -> None:
        assert self._new_results is not None
        for line in self._new_results.read(whole_lines=True).splitlines():
            result = json.loads(line)
            self._results[result["nodeid"]] = result
            self._reported.add(result["nodeid"])

    def _output_tail(self, lines: int = 60) -> str:
        """The last lines of the guest pytest's stdout, then of its stderr if it wrote any
        (where faulthandler puts the stacks of a hung test)."""
        assert self._guest is not None
        tails = []
        for name in ("stdout", "stderr"):
            path = self._guest.ctl_dir / name
            text = path.read_text(errors="replace") if path.exists() else ""
            if text.strip() or name == "stdout":
                tail = "\n".join(text.splitlines()[-lines:]) or "(nothing)"
                tails.append(tail if name == "stdout" else f"--- its stderr ---\n{tail}")
        return "\n".join(tails)


CHAIN_POLL_S = 2.0  # how often a chain looks whether its current guest is done


class GuestChain:
    """Guest runs one after the other, as one runner: the first boots when one of its tests is
    asked for, each next one as soon as the one before has reported all its tests (the host's
    pytest may be waiting on another guest meanwhile), or else when one of its own is asked
    for, the one before closed first. Two guests of a chain never run at once (beside another
    guest they would share the same CPUs), and each is sized for its own tests."""

    def __init__(self, runners: list[GuestRunner]) -> None:
        self._runners = runners
        self._owner = {nodeid: i for i, r in enumerate(runners) for nodeid in r.nodeids}
        self._lock = threading.Lock()  # one caller of the runners at a time
        self._current = 0  # the runner whose guest may run: those before it are closed
        self._closed = threading.Event()
        threading.Thread(target=self._follow, name="guest-chain", daemon=True).start()

    def result(self, nodeid: str) -> dict[str, Any]:
        """As GuestRunner.result."""
        i = self._owner[nodeid]
        with self._lock:
            self._move_to(i)
            return self._runners[i].result(nodeid)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            for runner in self._runners:
                runner.close()

    def _move_to(self, i: int) -> None:
        """(Under the lock.) Closes the runners before the i-th, if not done yet."""
        for runner in self._runners[self._current:i]:
            runner.close()
        self._current = max(self._current, i)

    def _follow(self) -> None:
        """Boots the next guest once the current one has reported all its tests. Lives until
        the chain is closed: a guest dies with the thread that started it (vm.py's
        PR_SET_PDEATHSIG is a thread's)."""
        while not self._closed.wait(CHAIN_POLL_S):
            with self._lock:
                if self._current + 1 < len(self._runners) \
                        and self._runners[self._current].reported_all():
                    self._move_to(self._current + 1)
                    # A failed boot is raised again to the test that asks for a result.
                    with contextlib.suppress(GuestError):
                        self._runners[self._current].boot()


Runner = GuestRunner | GuestChain


def route_items(config: pytest.Config, items: list[pytest.Item],
                runner: Callable[[list[str]], Runner] | None = None) -> Route | None:
    """Apply the route to the selected kernel items, in place (into a guest run made by
    `runner`, default the plain guest). The route, or None if no kernel test was selected."""
    return route_marked(config, items, "kernel", choose_route,
                        runner or (lambda nodeids: GuestRunner(config.rootpath, nodeids)))


def route_marked(config: pytest.Config, items: list[pytest.Item], marker: str,
                 choose: Callable[[], Route],
                 runner: Callable[[list[str]], Runner]) -> Route | None:
    """Route the selected items that carry `marker` (in place) as `choose` says, into one
    guest run made by `runner` if they go to a guest. The route, or None if none was
    selected."""
    selected = [item for item in items if item.get_closest_marker(marker)]
    if not selected:
        return None
    route = choose()
    apply_route(config, items, selected, route, runner)
    return route


def apply_route(config: pytest.Config, items: list[pytest.Item], routed: list[pytest.Item],
                route: Route, runner: Callable[[list[str]], Runner]) -> None:
    """Skip the `routed` items, or replace them in `items` by proxies of one guest run
    (made by `runner` from their node ids), as `route` says."""
    if route.where == "skip":
        for item in routed:
            item.add_marker(pytest.mark.skip(reason=route.reason))
    elif route.where == "guest":
        guest = runner([item.nodeid for item in routed])
        config.add_cleanup(guest.close)
        proxies = {
            item.nodeid: GuestProxy.from_parent(
                item.parent, name=item.name, original=item, runner=guest
            )
            for item in routed
        }
        items[:] = [proxies.get(item.nodeid, item) for item in items]
