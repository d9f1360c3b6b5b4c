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
    choose_route,
)
from .systemd_guest import artifacts_runner, build_infer
from .vm import BUSYBOX_INIT, NO_APPARMOR, GuestConfig

SWARM_GUEST_ENV = "DQOES_GUEST_SWARM"  # "1" in the swarm guest's test run
SWARM_OPT_IN_ENV = "DQOES_SWARM_TESTS"  # "1": run all the Swarm tests (`make test-swarm`)
# "1": a run of the other tests takes the multi-node smoke test too. Not `make test`'s default
# yet: its guest beside the systemd guest's last tests made their targets late (below).
SMOKE_OPT_IN_ENV = "DQOES_SWARM_SMOKE"
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
    multi-node smoke test) with SMOKE_OPT_IN_ENV=1. When the kernel tests go to a guest, the
    smoke test then goes last into their run (marked `kernel`; route it before them, with
    kernel_guest_runner): a third guest beside the kernel and systemd ones would share the
    same two CPUs. (Its guest still overlaps the systemd guest's last tests, whose targets
    were met late, past 240 s, in 3 runs of 3 with it and in none without.)"""
    selected = [item for item in items if item.get_closest_marker("guest_swarm")]
    if not _opted_in():
        smoke = os.environ.get(SMOKE_OPT_IN_ENV) == "1"
        skipped = Route("skip", f"opt in with {SWARM_OPT_IN_ENV}=1 (`make test-swarm`), or "
                        f"{SMOKE_OPT_IN_ENV}=1 for the multi-node smoke test alone")
        for item in selected:
            if not (smoke and item.get_closest_marker(SMOKE_MARKER)):
                item.add_marker(pytest.mark.skip(reason=skipped.reason))
        if not smoke:
            return skipped if selected else None
        selected = [item for item in selected if item.get_closest_marker(SMOKE_MARKER)]
        kernel = [item for item in items if item.get_closest_marker("kernel")]
        if selected and kernel and choose_route().where == "guest" \
                and not missing_swarm_guest_packages():
            for item in selected:
                item.add_marker(pytest.mark.kernel)
            items[:] = [item for item in items if item not in selected] + selected
            return Route("guest", "the smoke test only, in a guest of its own booted once the "
                         "kernel tests' guest is done")
    if not selected:
        return None
    route = choose_own_guest_route(SWARM_GUEST_ENV, "swarm test guest",
                                   missing_swarm_guest_packages,
                                   "they need a Docker Swarm of several nodes")
    apply_route(config, items, selected, route, lambda nodeids: _swarm_runner(config, nodeids))
    return route


def kernel_guest_runner(config: pytest.Config,
                        items: list[pytest.Item]) -> Callable[[list[str]], Runner]:
    """What runs the kernel tests in a guest: the plain guest, then, when route_swarm_items
    gave them the smoke test, a swarm guest of its own for it, booted once the plain one is
    done (the kernel tests' guest keeps its size: one booted with the swarm guest's memory
    stopped as a whole, both vCPUs halted, in 3 of the runs of the burst test)."""
    smoke = {item.nodeid for item in items if item.get_closest_marker("guest_swarm")}

    def runner(nodeids: list[str]) -> Runner:
        if smoke.isdisjoint(nodeids):
            return GuestRunner(config.rootpath, nodeids)
        return GuestChain([GuestRunner(config.rootpath, [n for n in nodeids if n not in smoke]),
                           _swarm_runner(config, [n for n in nodeids if n in smoke])])

    return runner


def _swarm_runner(config: pytest.Config, nodeids: list[str]) -> GuestRunner:
    guest = GuestConfig(init_mode=SWARM_INIT, memory_mib=SWARM_MEMORY_MIB)
    return artifacts_runner(config, nodeids, guest,
                            lambda into: {SWARM_GUEST_ENV: "1", **build_infer(into)})
