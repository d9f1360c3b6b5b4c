"""Targets from a container engine's labels (membership/engine_targets.py), driven by the
controller's tick, on a fake
cgroup tree with a stand-in watcher: they come and go with their containers, dqoesctl's
target wins, refused labels are listed and change nothing, a full listing drops what is
gone (a restart of dqoesd or of the engine)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from dqoes_cg.cgroup import CgroupError, Kind, Resolved
from dqoes_cg.membership import engine_targets
from dqoes_cg.membership.engine_targets import Changes, Seen
from dqoes_cg.membership.objective import Objective
from dqoes_cg.membership.targets import TargetError
from dqoes_cg.state import StateError, StateStore
from lab.fakecg import make_cgroup
from tests.test_controller import ORIGINAL, Host, _cpu_max

A, B = "a" * 64, "b" * 64


class StubWatcher:
    def __init__(self) -> None:
        self.changes: Changes | None = None
        self.pushed: list[tuple[str, dict[str, str] | None]] = []

    def take(self) -> Changes | None:
        changes, self.changes = self.changes, None
        return changes

    def report(self, *seen: Seen | tuple[str, None], listed: bool = False) -> None:
        self.changes = Changes(listed, {s[0] if isinstance(s, tuple) else s.id:
                                        None if isinstance(s, tuple) else s for s in seen})

    def push_service_labels(self, sid: str, labels: dict[str, str] | None) -> None:
        self.pushed.append((sid, labels))


def seen(host: Host, cid: str, name: str, target: float | None = 0.1, error: str | None = None,
         source: str = "label", ring: Path | None = None) -> Seen:
    cgroup = host.mount / "docker" / cid
    return Seen(cid, name, None if target is None else Objective(target, "mean"), source,
                error, Resolved(cgroup, name, Kind.DOCKER, container_id=cid), ring)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


def controller(host: Host, watcher: StubWatcher):
    c = host.controller()
    c.engine_targets.watcher = watcher
    return c


def test_a_labelled_container_is_bound_at_the_next_tick_and_given_back(host: Host) -> None:
    w = StubWatcher()
    c = controller(host, w)
    w.report(seen(host, A, "web"), listed=True)
    c.tick(time.monotonic())
    (row,) = c.listings()
    assert (row.name, row.state, row.source, row.cgroup) == ("web", "bound", "label",
                                                            str(host.a))
    assert _cpu_max(host.a) == "50000 100000"  # limited in the same tick
    w.report(seen(host, A, "web", target=0.2, source="service"))
    c.tick(time.monotonic())
    assert (c.targets.get("web").target_s, c.targets.get("web").source) == (0.2, "service")
    with pytest.raises(TargetError, match="comes from its service's labels"):
        c.unset_target("web")
    w.report((A, None))  # stopped (the test's cgroup stays: the limit is given back)
    c.tick(time.monotonic())
    assert c.listings() == [] and _cpu_max(host.a) == ORIGINAL
    c.shutdown()


def test_refused_labels_are_listed_and_change_nothing(host: Host,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    w = StubWatcher()
    c = controller(host, w)
    bad = seen(host, A, "bad", target=None, error="dqoes.target: bad duration 'fast'")
    w.report(bad, seen(host, B, "good"), listed=True)
    c.tick(time.monotonic())
    rows = {r.name: r for r in c.listings()}
    assert (rows["bad"].state, rows["bad"].reason, rows["bad"].target_s) == \
        ("invalid", "dqoes.target: bad duration 'fast'", None)
    assert rows["good"].state == "bound"
    assert _cpu_max(host.a) == ORIGINAL
    w.report(bad)  # seen again, unchanged: logged once
    c.tick(time.monotonic())
    assert caplog.text.count("bad: labels refused") == 1
    c.shutdown()


def test_dqoesctl_wins_and_the_labels_come_back_after_unset(host: Host) -> None:
    w = StubWatcher()
    c = controller(host, w)
    w.report(seen(host, A, "web", target=0.1), listed=True)
    c.tick(time.monotonic())
    c.set_target("web", Objective(0.3, "p99"), False)
    w.report(seen(host, A, "web", target=0.2))  # a label change does not override it
    c.tick(time.monotonic())
    assert (c.targets.get("web").target_s, c.targets.get("web").source) == (0.3, "cli")
    w.report(seen(host, B, "other"))
    c.tick(time.monotonic())
    with pytest.raises(TargetError, match=r"already managed as 'other' \(by its labels\)"):
        # the same container, by its path
        c.set_target("docker/" + B, Objective(0.1, "mean"), False)
    c.unset_target("web")
    assert (c.targets.get("web").target_s, c.targets.get("web").source) == (0.2, "label")
    c.shutdown()


def test_a_listing_drops_the_targets_of_containers_gone_meanwhile(host: Host) -> None:
    w = StubWatcher()
    c = controller(host, w)
    w.report(seen(host, A, "web"), seen(host, B, "db"), listed=True)
    c.tick(time.monotonic())
    c.shutdown()
    again = controller(host, w)  # dqoesd restarted: the targets are re-adopted...
    assert {r.name for r in again.listings()} == {"web", "db"}
    w.report(seen(host, B, "db"), listed=True)  # ...and web is gone when it lists again
    again.tick(time.monotonic())
    assert {r.name for r in again.listings()} == {"db"}
    again.shutdown()


def test_a_container_not_yet_in_its_cgroup_waits(host: Host) -> None:
    w = StubWatcher()
    c = controller(host, w)
    w.report(Seen(A, "web", Objective(0.1, "mean"), "label", None, CgroupError("not running"),
                  None), listed=True)
    c.tick(time.monotonic())
    (row,) = c.listings()
    assert (row.state, row.reason) == ("pending", "not running")
    w.report(seen(host, A, "web"))
    c.tick(time.monotonic())
    assert c.listings()[0].state == "bound"
    c.shutdown()


def test_service_labels_pushed_through_the_control_api(host: Host) -> None:
    from dqoes_cg import api
    from dqoes_cg.control import Peer, RequestError

    w = StubWatcher()
    c = controller(host, w)
    root = Peer(1, 0, 0)
    api.handle(c, "service-labels", {"service_id": "abc123", "labels": {"dqoes.target": "1s"}},
               root)
    api.handle(c, "service-labels", {"service_id": "abc123", "labels": None}, root)
    assert w.pushed == [("abc123", {"dqoes.target": "1s"}), ("abc123", None)]
    for bad in ({"service_id": "../x", "labels": None}, {"service_id": "a", "labels": [1]},
                {"service_id": "a", "labels": {"k": 1}}):
        with pytest.raises(RequestError):
            api.handle(c, "service-labels", bad, root)
    assert api.OPERATIONS["service-labels"].write
    c.engine_targets.watcher = None
    with pytest.raises(RequestError, match="follows no container engine"):
        api.handle(c, "service-labels", {"service_id": "a", "labels": None}, root)
    c.shutdown()


def test_no_value_from_the_engine_stops_the_loop(host: Host) -> None:
    """A name the watcher would refuse, reported anyway: its change fails alone."""
    w = StubWatcher()
    c = controller(host, w)
    w.report(seen(host, A, "\udcff"), seen(host, B, "good"), listed=True)
    c.tick(time.monotonic())
    assert c.targets.get("good").cgroup is not None
    c.shutdown()


def test_labels_get_no_more_targets_than_the_descriptors_hold(
        host: Host, caplog: pytest.LogCaptureFixture) -> None:
    """The open-file limit caps them as it caps dqoesctl set-target: the excess are refused
    with the reason, listed and logged once, never bound, until room is made."""
    w = StubWatcher()
    c = controller(host, w)
    c.max_targets = 1
    w.report(seen(host, A, "web"), seen(host, B, "db"), listed=True)
    c.tick(time.monotonic())
    rows = {r.name: r for r in c.listings()}
    assert rows["web"].state == "bound" and _cpu_max(host.b) == "max 100000"
    assert rows["db"].state == "invalid" and "no room for more than 1 targets" in \
        rows["db"].reason
    w.report(seen(host, B, "db"))  # seen again: still refused, not logged again
    c.tick(time.monotonic())
    assert "db" not in c.targets and caplog.text.count("db: labels refused") == 1
    with pytest.raises(TargetError, match="no room for more than 1 targets"):
        c.set_target("other", Objective(0.1, "mean"), True)
    w.report((A, None))  # web stops: db takes the room it leaves
    for _ in range(2):
        c.tick(time.monotonic())
    assert [(r.name, r.state) for r in c.listings()] == [("db", "bound")]
    c.shutdown()


def test_a_burst_of_containers_joins_over_several_ticks(
        host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """So that requests are answered between ticks during a burst; a listing's sweep of the
    targets whose containers are gone waits until the whole listing is applied."""
    monkeypatch.setattr(engine_targets, "ENGINE_BUDGET_S", -1.0)  # one a tick
    w = StubWatcher()
    c = controller(host, w)
    c.set_target("old", Objective(0.1, "mean"), True, source="label")  # of a previous run
    ids = [f"{i:x}" * 64 for i in range(3, 8)]
    for cid in ids:
        make_cgroup(host.mount, "docker/" + cid)
    w.report(*(seen(host, cid, f"c{i}") for i, cid in enumerate(ids)), listed=True)
    counts = []
    for _ in range(5):
        c.tick(time.monotonic())
        counts.append((len([t for t in c.targets if t.name != "old"]), "old" in c.targets))
    assert counts == [(1, True), (2, True), (3, True), (4, True), (5, False)]
    c.shutdown()


def test_a_tick_s_changes_are_written_through_to_disk_once(
        host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """One fsync of the journal for all the targets a burst of containers adds in a tick,
    durable before the tick acts, and one for all it removes (2,000 containers took 2,044
    and 4,021 fsyncs: 83 adds/s and 42 removals/s)."""
    w = StubWatcher()
    c = controller(host, w)
    ids = [f"{i:x}" * 64 for i in range(3, 8)]
    for cid in ids:
        make_cgroup(host.mount, "docker/" + cid)
    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    w.report(*(seen(host, cid, f"c{i}") for i, cid in enumerate(ids)), listed=True)
    c.tick(time.monotonic())
    assert sorted(c.fleet.names) == [f"c{i}" for i in range(5)]
    assert len(fsyncs) == 2  # the adds, then the originals saved before the first limit
    assert sorted(host.state()) == [f"c{i}" for i in range(5)]
    fsyncs.clear()
    w.report(listed=True)  # all of them stop: their limits given back, their targets gone
    c.tick(time.monotonic())
    assert c.listings() == [] and len(fsyncs) == 1
    assert host.state() == {}
    c.shutdown()


def test_new_targets_that_cannot_be_written_through_are_undone(
        host: Host, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A full disk at the tick's one write through: no target, ring or limit is left of
    the containers it would have added, and one error line says so."""
    w = StubWatcher()
    c = controller(host, w)

    def full(store: StateStore) -> None:
        if store.unsynced:
            raise StateError("cannot write the state log: No space left on device")

    monkeypatch.setattr(StateStore, "sync", full)
    w.report(seen(host, A, "web"), seen(host, B, "db"), listed=True)
    c.tick(time.monotonic())
    assert c.listings() == [] and len(c.fleet) == 0
    assert _cpu_max(host.a) == ORIGINAL
    assert not list((host.tmp / "run").glob("rings/*/ring"))
    assert caplog.text.count("No space left on device; 2 new target(s) undone") == 1
    c.shutdown()
