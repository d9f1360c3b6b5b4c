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
from dataclasses import replace

import pytest

from .prereqs import missing_guest_packages
from .routing import GuestRunner, Route, choose_own_guest_route, route_marked
from .systemd_guest import artifacts_runner, build_infer
from .vm import BUSYBOX_INIT, NO_APPARMOR, GuestConfig

SWARM_GUEST_ENV = "DQOES_GUEST_SWARM"  # "1" in the swarm guest's test run
SWARM_OPT_IN_ENV = "DQOES_SWARM_TESTS"  # "1": run the Swarm tests (`make test-swarm`)
# What the Swarm's nodes run, by the Debian package that provides it.
SWARM_GUEST_TOOLS = {"docker.io": "/usr/sbin/dockerd", "iproute2": "/bin/ip",
                     "util-linux": "/usr/bin/unshare"}
SWARM_INIT = replace(BUSYBOX_INIT, name="swarm", cmdline=(NO_APPARMOR,))
# Three engines with their containerd and a few tasks take about 650 MB.
SWARM_MEMORY_MIB = 4096


def missing_swarm_guest_packages() -> list[str]:
    """What to install before a guest can run a Swarm: Debian packages, and pyroute2 (the
    lab's extra) which builds the nodes' network."""
    missing = missing_guest_packages(SWARM_GUEST_TOOLS)
    if importlib.util.find_spec("pyroute2") is None:
        missing.append("pyroute2 (pip)")
    return missing


def choose_swarm_route() -> Route:
    # Opt-in: once, on a host loaded by five guests, a node's dockerd died mid-session
    # (cause not found yet); the session passes alone in about 11 minutes.
    if os.environ.get(SWARM_GUEST_ENV) != "1" and os.environ.get(SWARM_OPT_IN_ENV) != "1":
        return Route("skip", f"opt in with {SWARM_OPT_IN_ENV}=1 (`make test-swarm`)")
    return choose_own_guest_route(SWARM_GUEST_ENV, "swarm test guest",
                                  missing_swarm_guest_packages,
                                  "they need a Docker Swarm of several nodes")


def route_swarm_items(config: pytest.Config, items: list[pytest.Item]) -> Route | None:
    """Route the selected `guest_swarm` items (in place); None if none was selected."""
    def runner(nodeids: list[str]) -> GuestRunner:
        guest = GuestConfig(init_mode=SWARM_INIT, memory_mib=SWARM_MEMORY_MIB)
        return artifacts_runner(config, nodeids, guest,
                                lambda into: {SWARM_GUEST_ENV: "1", **build_infer(into)})

    return route_marked(config, items, "guest_swarm", choose_swarm_route, runner)
