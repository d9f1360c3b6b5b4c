"""The "swarm" guest: the busybox init mode with room and kernel arguments for a Docker
Swarm of several nodes (lab/swarm.py), and the routing of the tests marked `guest_swarm`
into one such guest per session (like `kernel` tests, routing.py), where they share one
Swarm (the `swarm` fixture).

    with Guest(GuestConfig(init_mode=SWARM_INIT, memory_mib=SWARM_MEMORY_MIB)) as guest:
        guest.run(["python3", "-m", "lab.swarm"])
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import replace

import pytest

from .prereqs import missing_guest_packages
from .routing import (
    GuestChain,
    GuestRunner,
    Route,
    Runner,
    apply_route,
    choose_own_guest_route,
)
from .systemd_guest import artifacts_runner, build_infer, choose_systemd_route, systemd_runner
from .vm import BUSYBOX_INIT, NO_APPARMOR, GuestConfig

SWARM_GUEST_ENV = "DQOES_GUEST_SWARM"  # "1" in the swarm guest's test run
SWARM_OPT_IN_ENV = "DQOES_SWARM_TESTS"  # "1": run all the Swarm tests (`make test-swarm`)
# "0": a run of the other tests leaves the multi-node smoke test out (it is in by default).
SMOKE_OPT_OUT_ENV = "DQOES_SWARM_SMOKE"
# Marks the multi-node smoke test among the guest_swarm tests: three nodes up, a labelled
# service measured on each, a node lost and back, one placement move.
SMOKE_MARKER = "swarm_smoke"
# What the Swarm's nodes run, by the Debian package that provides it.
SWARM_GUEST_TOOLS = {"docker.io": "/usr/sbin/dockerd", "iproute2": "/bin/ip",
                     "util-linux": "/usr/bin/unshare"}
SWARM_INIT = replace(BUSYBOX_INIT, name="swarm", cmdline=(NO_APPARMOR,))
# Three engines with their containerd and a few tasks take about 650 MB, in the guest's
# tmpfs.
SWARM_MEMORY_MIB = 4096


def missing_swarm_guest_packages() -> list[str]:
    """What to install before a guest can run a Swarm: Debian packages, and pyroute2 (the
    lab's extra) which builds the nodes' network."""
    missing = missing_guest_packages(SWARM_GUEST_TOOLS)
    if importlib.util.find_spec("pyroute2") is None:
        missing.append("pyroute2 (pip)")
    return missing


def _opted_in() -> bool:
    return "1" in (os.environ.get(SWARM_GUEST_ENV), os.environ.get(SWARM_OPT_IN_ENV))


def route_swarm_items(config: pytest.Config, items: list[pytest.Item]) -> Route | None:
    """Route the selected `guest_swarm` items (in place); None if none was selected.

    Without the opt-in they are skipped, but for those also marked SMOKE_MARKER (the
    multi-node smoke test), unless SMOKE_OPT_OUT_ENV=0. When the systemd tests go to a
    guest, the smoke test then goes last into their run (marked `guest_systemd`; route it
    before them, with systemd_guest_runner): its guest beside the systemd guest's made the
    targets of test_e2e_service.py's docker-systemd test late (past 240 s: the emulated CPU
    1.8 times slower) in 4 runs of 4, and a third guest beside the kernel and systemd ones
    would share the same two CPUs too."""
    selected = [item for item in items if item.get_closest_marker("guest_swarm")]
    if not _opted_in():
        smoke = os.environ.get(SMOKE_OPT_OUT_ENV) != "0"
        skipped = Route("skip", f"opt in with {SWARM_OPT_IN_ENV}=1 (`make test-swarm`); the "
                        f"multi-node smoke test runs unless {SMOKE_OPT_OUT_ENV}=0")
        for item in selected:
            if not (smoke and item.get_closest_marker(SMOKE_MARKER)):
                item.add_marker(pytest.mark.skip(reason=skipped.reason))
        if not smoke:
            return skipped if selected else None
        selected = [item for item in selected if item.get_closest_marker(SMOKE_MARKER)]
        after = [item for item in items if item.get_closest_marker("guest_systemd")]
        if selected and after and choose_systemd_route().where == "guest" \
                and not missing_swarm_guest_packages():
            for item in selected:
                item.add_marker(pytest.mark.guest_systemd)
            items[:] = [item for item in items if item not in selected] + selected
            return Route("guest", "the smoke test only, in a guest of its own booted once the "
                         "systemd tests' guest is done")
    if not selected:
        return None
    route = choose_own_guest_route(SWARM_GUEST_ENV, "swarm test guest",
                                   missing_swarm_guest_packages,
                                   "they need a Docker Swarm of several nodes")
    apply_route(config, items, selected, route, lambda nodeids: _swarm_runner(config, nodeids))
    return route


def systemd_guest_runner(config: pytest.Config,
                         items: list[pytest.Item]) -> Callable[[list[str]], Runner]:
    """What runs the systemd tests in a guest: the systemd guest, then, when
    route_swarm_items gave them the smoke test, a swarm guest of its own for it, booted once
    the systemd guest is done."""
    smoke = {item.nodeid for item in items if item.get_closest_marker("guest_swarm")}

    def runner(nodeids: list[str]) -> Runner:
        systemd = systemd_runner(config, [n for n in nodeids if n not in smoke])
        if smoke.isdisjoint(nodeids):
            return systemd
        return GuestChain([systemd, _swarm_runner(config, [n for n in nodeids if n in smoke])])

    return runner


def _swarm_runner(config: pytest.Config, nodeids: list[str]) -> GuestRunner:
    guest = GuestConfig(init_mode=SWARM_INIT, memory_mib=SWARM_MEMORY_MIB)
    return artifacts_runner(config, nodeids, guest,
                            lambda into: {SWARM_GUEST_ENV: "1", **build_infer(into)})
