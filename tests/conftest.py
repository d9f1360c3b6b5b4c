"""Shared fixtures, and the routing of `kernel` tests (see lab/guest/README.md):
on this host if it has cgroup v2 with the cpu controller, else in a qemu guest booted once
per session, else skipped with the reason."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.cgroups import cgroup2_cpu_mount, make_test_cgroup, remove_cgroup_tree
from lab.guest.report import RESULTS_ENV, ResultWriter, TimeLimit
from lab.guest.routing import Route, route_items
from lab.guest.swarm_guest import route_swarm_items, systemd_guest_runner
from lab.guest.systemd_guest import route_systemd_items
from lab.images import BUSYBOX
from lab.swarm import BUSYBOX_IMAGE, THREE_NODES, Swarm

_route_key = pytest.StashKey[Route | None]()
_systemd_route_key = pytest.StashKey[Route | None]()
_swarm_route_key = pytest.StashKey[Route | None]()
GUEST_MARKERS = ("guest_systemd", "guest_swarm")  # each its own guest; else "kernel"'s


def pytest_configure(config: pytest.Config) -> None:
    results = os.environ.get(RESULTS_ENV)
    if results:  # this is the guest's pytest: report each result to the host
        config.pluginmanager.register(ResultWriter(Path(results)), "dqoes-guest-results")
        config.pluginmanager.register(TimeLimit.from_environment(), "dqoes-guest-test-limit")


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: route only what was selected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    config.stash[_swarm_route_key] = route_swarm_items(config, items)  # first: see its doc
    config.stash[_route_key] = route_items(config, items)
    config.stash[_systemd_route_key] = route_systemd_items(
        config, items, systemd_guest_runner(config, items))


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    lines = []
    for key, what, guest in ((_route_key, "kernel tests", "in a qemu guest, booted once"),
                             (_systemd_route_key, "end-to-end (guest_systemd) tests",
                              "in a qemu guest with systemd as PID 1, booted once"),
                             (_swarm_route_key, "multi-node Swarm (guest_swarm) tests",
                              "in a qemu guest running a Swarm of three engines, booted once")):
        route = config.stash.get(key, None)
        if route is not None:
            where = {"host": "on this host", "guest": guest, "skip": "skipped"}[route.where]
            lines.append(f"{what}: {where} ({route.reason})")
    return lines


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How long the tests that ran in a guest took there, per guest, and the slowest: the
    guests run beside the host's tests, so the session lasts as long as its longest guest."""
    timed = [(dict(r.user_properties)["guest_duration"], r.nodeid,
              next((m for m in GUEST_MARKERS if m in r.keywords), "kernel"))
             for reports in terminalreporter.stats.values() for r in reports
             if getattr(r, "when", None) == "call"
             and "guest_duration" in dict(getattr(r, "user_properties", ()))]
    if not timed:
        return
    totals = {g: sum(t for t, _, guest in timed if guest == g) for g in {g for *_, g in timed}}
    terminalreporter.write_sep("-", "time in the guests: " + ", ".join(
        f"{guest} {seconds / 60:.1f} min" for guest, seconds in sorted(totals.items())))
    for seconds, nodeid, _ in sorted(timed, reverse=True)[:12]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {nodeid}")


@pytest.fixture(scope="session")
def cgroup2_mount() -> Path:
    """Mount point of a cgroup v2 hierarchy with the cpu controller."""
    mount = cgroup2_cpu_mount()
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy with the cpu controller here (mark the test kernel)")
    return mount


@pytest.fixture(scope="session")
def swarm() -> Iterator[Swarm]:
    """The Docker Swarm of three nodes of the swarm guest (lab/swarm.py), built once per
    session and shared: a test that faults a node restores it, and removes its services.
    Every node has the image BUSYBOX_IMAGE."""
    swarm = Swarm(THREE_NODES).up(images={BUSYBOX_IMAGE: {"busybox": BUSYBOX}})
    yield swarm
    swarm.down()


@pytest.fixture(autouse=True)
def swarm_as_up_left_it(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test on the session's Swarm starts from it as up() left it and leaves it so, passed
    or failed: one test's leftovers never fail the next."""
    if "swarm" not in request.fixturenames:
        yield
        return
    swarm: Swarm = request.getfixturevalue("swarm")
    for change in swarm.restore():  # what an earlier test left and could not undo
        print(f"before the test: {change}")
    yield
    changes = swarm.restore()
    assert not changes, f"the test left the Swarm changed: {'; '.join(changes)}"


@pytest.fixture
def cgroup_root(cgroup2_mount: Path) -> Iterator[Path]:
    """A fresh, empty cgroup whose children get cpu.max and cpu.stat. Removed afterwards
    with its children; processes still in it are killed first."""
    path = make_test_cgroup(cgroup2_mount)
    try:
        yield path
    finally:
        remove_cgroup_tree(path)
