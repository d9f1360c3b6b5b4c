"""The "systemd" init mode: a guest whose PID 1 is the host's systemd, with its system bus
and Docker's engine at hand, for the end-to-end tests of dqoesd as a service
(systemd-init), and the routing of the tests marked `guest_systemd` into one such guest per
session (like `kernel` tests, routing.py).

    with Guest(GuestConfig(init_mode=SYSTEMD_INIT)) as guest:
        guest.run(["systemctl", "is-system-running"])
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from .initramfs import GUEST_DIR
from .prereqs import missing_guest_packages
from .routing import GuestRunner, Route, Runner, choose_own_guest_route, route_marked
from .vm import NO_APPARMOR, GuestConfig, InitMode, Share

SYSTEMD_GUEST_ENV = "DQOES_GUEST_SYSTEMD"  # "1" in the systemd guest's test run
ARTIFACTS_ENV = "DQOES_E2E_ARTIFACTS"  # what the host built for the tests (see below)
REPO = GUEST_DIR.parent.parent
# What the end-to-end tests run, by the Debian package that provides it.
SYSTEMD_GUEST_TOOLS = {"systemd": "/lib/systemd/systemd", "dbus": "/usr/bin/dbus-daemon",
                       "docker.io": "/usr/sbin/dockerd", "gcc": "/usr/bin/gcc",
                       "libc6-dev": "/usr/lib/x86_64-linux-gnu/libc.a"}

SYSTEMD_INIT = InitMode("systemd", GUEST_DIR / "systemd-init", cmdline=(
    "systemd.unit=dqoes-guest.target", NO_APPARMOR, "systemd.show_status=error",
))


def missing_systemd_guest_packages() -> list[str]:
    """Debian packages to install before a systemd guest can run the end-to-end tests."""
    return missing_guest_packages(SYSTEMD_GUEST_TOOLS)


def build_infer(into: Path) -> dict[str, str]:
    """The static inference server (infer.c) that test containers run, built on the host
    (minutes on the guest's emulated CPU); the guest's environment names the directory."""
    subprocess.run(["gcc", "-O2", "-static", "-Wall", "-Wextra", "-Werror",
                    f"-I{REPO / 'csrc'}", "-o", str(into / "infer"), str(GUEST_DIR / "infer.c"),
                    "-lm"],
                   check=True, capture_output=True, timeout=300)
    return {ARTIFACTS_ENV: str(into)}


def build_e2e_artifacts(into: Path) -> dict[str, str]:
    """build_infer's, and the wheel that `make install PACKAGE=...` installs."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "--disable-pip-version-check", "-w", str(into),
                    str(REPO)], check=True, capture_output=True, timeout=600)
    return {SYSTEMD_GUEST_ENV: "1", **build_infer(into)}


def choose_systemd_route() -> Route:
    return choose_own_guest_route(SYSTEMD_GUEST_ENV, "systemd test guest",
                                  missing_systemd_guest_packages,
                                  "they need systemd as PID 1 and Docker's engine")


def systemd_runner(config: pytest.Config, nodeids: list[str]) -> GuestRunner:
    """The systemd guest's run of `nodeids`."""
    return artifacts_runner(config, nodeids, GuestConfig(init_mode=SYSTEMD_INIT),
                            build_e2e_artifacts)


def route_systemd_items(config: pytest.Config, items: list[pytest.Item],
                        runner: Callable[[list[str]], Runner] | None = None) -> Route | None:
    """Route the selected `guest_systemd` items (in place) into one guest run made by
    `runner` (default: the systemd guest); None if none was selected."""
    return route_marked(config, items, "guest_systemd", choose_systemd_route,
                        runner or (lambda nodeids: systemd_runner(config, nodeids)))


def artifacts_runner(config: pytest.Config, nodeids: list[str], guest: GuestConfig,
                     build: Callable[[Path], dict[str, str]]) -> GuestRunner:
    """A runner of `nodeids` in `guest`, with what `build` makes on the host just before the
    boot in a directory shared into the guest (removed at the session's end)."""
    artifacts = Path(tempfile.mkdtemp(prefix="dqoes-e2e-"))
    config.add_cleanup(lambda: shutil.rmtree(artifacts, ignore_errors=True))
    guest = replace(guest, shares=(*guest.shares, Share("e2e", artifacts)))
    return GuestRunner(config.rootpath, nodeids, guest, prepare=lambda: build(artifacts))
