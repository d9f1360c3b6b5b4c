"""Shared fixtures, and the routing of `kernel` tests (see tests/guest/README.md):
on this host if it has cgroup v2 with the cpu controller, else in a qemu guest booted once
per session, else skipped with the reason."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.guest.cgroups import cgroup2_cpu_mount, make_test_cgroup, remove_cgroup_tree
from tests.guest.report import RESULTS_ENV, ResultWriter
from tests.guest.routing import Route, route_items

_route_key = pytest.StashKey[Route | None]()


def pytest_configure(config: pytest.Config) -> None:
    results = os.environ.get(RESULTS_ENV)
    if results:  # this is the guest's pytest: report each result to the host
        config.pluginmanager.register(ResultWriter(Path(results)), "dqoes-guest-results")


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: route only what was selected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    config.stash[_route_key] = route_items(config, items)


def pytest_report_collectionfinish(config: pytest.Config) -> str | None:
    route = config.stash.get(_route_key, None)
    if route is None:
        return None
    where = {"host": "on this host", "guest": "in a qemu guest, booted once", "skip": "skipped"}
    return f"kernel tests: {where[route.where]} ({route.reason})"


@pytest.fixture(scope="session")
def cgroup2_mount() -> Path:
    """Mount point of a cgroup v2 hierarchy with the cpu controller."""
    mount = cgroup2_cpu_mount()
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy with the cpu controller here (mark the test kernel)")
    return mount


@pytest.fixture
def cgroup_root(cgroup2_mount: Path) -> Iterator[Path]:
    """A fresh, empty cgroup whose children get cpu.max and cpu.stat. Removed afterwards
    with its children; processes still in it are killed first."""
    path = make_test_cgroup(cgroup2_mount)
    try:
        yield path
    finally:
        remove_cgroup_tree(path)
