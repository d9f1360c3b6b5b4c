"""Following a container engine (engines/client.py, engines/watcher.py) against a fake engine
on a unix socket: listing at connect, events, reconnects, coalescing, service labels, bounds."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dqoes_cg.cgroup import CgroupError, Kind, Resolved
from dqoes_cg.engines.client import (
    MAX_LABEL_CHARS,
    MAX_LABELS,
    SERVICE_ID,
    Engine,
    EngineError,
    parse_container,
    parse_event,
)
from dqoes_cg.engines.followed import NameAsker
from dqoes_cg.engines.watcher import SUBSCRIPTION_S, Watcher
from dqoes_cg.membership.engine_targets import Changes, Seen
from dqoes_cg.membership.labels import objective
from dqoes_cg.membership.objective import Objective
from dqoes_cg.ring import ring_dir_name
from tests.fakeengine import FakeEngine

LABELS = {"dqoes.target": "40ms"}


def cid(i: int) -> str:
    return f"{i:04x}" + "c" * 60


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[FakeEngine]:
    fake = FakeEngine(tmp_path / "docker.sock")
    yield fake
    fake.close()


def resolved(pid: int) -> Resolved:
    return Resolved(Path(f"/cg/{pid}"), f"/{pid}", Kind.PID)


@pytest.fixture
def watcher(engine: FakeEngine) -> Iterator[Watcher]:
    w = Watcher(Engine(engine.path, timeout=5), resolved, lambda v: Path("/vol", v, "ring"))
    yield w
    w.close()


def collect(w: Watcher, until: Callable[[Changes], bool], timeout: float = 30) -> Changes:
    """Everything the watcher reported, merged, until `until` holds for it."""
    merged = Changes(listed=False)
    deadline = time.monotonic() + timeout
    while True:
        c = w.take()
        if c is not None:
            merged.listed |= c.listed
            if c.listed:
                merged.seen.clear()
            merged.seen.update(c.seen)
        if until(merged):
            return merged
        assert time.monotonic() < deadline, f"timed out; got {merged}"
        time.sleep(0.01)


def test_parse_container_and_events() -> None:
    c = parse_container({"Id": cid(1), "Name": "/web", "State": {"Running": True, "Pid": 7},
                         "Config": {"Labels": {"dqoes.a": "b", "n": 1, "x" * 5000: "y"}},
                         "Mounts": [{"Type": "volume", "Driver": "dqoes", "Name": "v"},
                                    {"Type": "bind", "Source": "/x"}, "junk"]})
    assert (c.name, c.pid, c.running, c.labels, c.volumes) == \
        ("web", 7, True, {"dqoes.a": "b"}, (("dqoes", "v"),))
    for bad in (None, [], {"Id": 1}, {"Id": "x", "Name": "/n", "State": {"Pid": "7"}}):
        with pytest.raises(ValueError):
            parse_container(bad)
    assert parse_event(b'{"Type":"container","Action":"exec_start: sh","Actor":{"ID":"x"}}'
                       ).action == "exec_start"
    for line in (b"", b"[", b"[]", b'{"Type":1}', b"[" * 100000):
        assert parse_event(line) is None


def inspected(labels: dict[str, str]) -> dict[str, str]:
    return parse_container({"Id": cid(1), "Name": "/c", "State": {"Running": True, "Pid": 7},
                            "Config": {"Labels": labels}}).labels


@pytest.mark.parametrize(("labels", "reason"), [
    ({"dqoes.target": "4" * 5000 + "ms"}, "longer than 64 characters"),
    ({"dqoes.target": "40ms", "dqoes." + "k" * (1 << 20): "v"}, "unknown label 'dqoes.kkk"),
    ({"dqoes.target": "40ms", "dqoes.metric": "p" * 5000}, "unknown metric 'ppp"),
    ({f"dqoes.k{i}": "v" for i in range(MAX_LABELS * 2)}, "unknown label 'dqoes.k0'"),
])
def test_no_dqoes_label_vanishes(labels: dict[str, str], reason: str) -> None:
    """However long, or many: each is refused with a reason, not dropped unseen."""
    kept = inspected(labels)
    assert len(kept) <= MAX_LABELS and all(len(k) + len(v) <= 2 * MAX_LABEL_CHARS
                                           for k, v in kept.items())
    with pytest.raises(ValueError, match=reason):
        objective(kept)


def test_only_the_labels_read_are_kept() -> None:
    """Of 512 labels of 4 KB (2 MB), the two dqoes-cg reads: one after the 512th counts."""
    labels = {f"team.{i}": "x" * 4000 for i in range(512)}
    labels.update({SERVICE_ID: "svc1", "dqoes.target": "40ms"})
    assert inspected(labels) == {SERVICE_ID: "svc1", "dqoes.target": "40ms"}
    assert objective(inspected(labels)) == Objective(0.04, "p95")


def test_engine_errors_are_one_line(tmp_path: Path, engine: FakeEngine) -> None:
    with pytest.raises(EngineError, match=r"Docker \(API at .*\): not running \(no socket\)"):
        Engine(tmp_path / "none.sock").running()
    assert Engine(engine.path).inspect("nosuch") is None
    assert Engine(engine.path).services() is None  # not a manager


def test_a_reply_with_no_body_is_none(engine: FakeEngine) -> None:
    """Docker answers a node's update with 200 and nothing else."""
    assert Engine(engine.path).call("POST", "/nodes/n1/update", {"version": "3"},
                                    body={"Availability": "pause"}) is None


def test_a_listing_at_connect_then_events(engine: FakeEngine, watcher: Watcher) -> None:
    engine.add(cid(1), "web", LABELS, pid=11)
    engine.add(cid(2), "plain", None, pid=12)  # neither labels nor volume: not ours
    engine.add(cid(3), "vol", None, pid=13, volumes=(("dqoes", "v3"), ("local", "x")))
    watcher.start()
    first = collect(watcher, lambda c: c.listed)
    assert first.seen == {
        cid(1): Seen(cid(1), "web", Objective(0.04, "p95"), "label", None, resolved(11), None),
        cid(3): Seen(cid(3), "vol", None, "label", None, resolved(13), Path("/vol/v3/ring"))}
    assert watcher.container_id("plain") == cid(2)
    engine.add(cid(4), "late", {**LABELS, "dqoes.metric": "nope"}, pid=14)
    engine.event("container", "start", cid(4))
    late = collect(watcher, lambda c: cid(4) in c.seen).seen[cid(4)]
    assert late.objective is None and "unknown metric 'nope'" in late.error
    engine.containers[cid(1)]["State"]["Running"] = False
    engine.event("container", "die", cid(1))
    assert collect(watcher, lambda c: cid(1) in c.seen).seen[cid(1)] is None
    assert watcher.container_id("web") is None


def test_a_malformed_name_is_refused_with_its_reason(engine: FakeEngine,
                                                    watcher: Watcher) -> None:
    """Docker refuses such names, but the engine's answers are input like any other."""
    for i, name in enumerate(("\udcff", "web\nforged", "x" * 300, "../up", "")):
        engine.add(cid(i), name, LABELS, pid=10 + i)
    watcher.start()
    seen = collect(watcher, lambda c: c.listed).seen
    assert len(seen) == 5
    for s in seen.values():
        assert s.objective is None and "not a container name" in s.error
        assert s.name.startswith("<") and s.name.isascii() and s.name.isprintable()
        ring_dir_name(s.name)


def test_a_restart_loop_settles_on_its_last_state(engine: FakeEngine, watcher: Watcher) -> None:
    watcher.start()
    collect(watcher, lambda c: c.listed)
    engine.add(cid(5), "loop", LABELS, pid=15)
    for _ in range(50):
        engine.event("container", "start", cid(5))
        engine.event("container", "die", cid(5))
    engine.add(cid(6), "marker", LABELS, pid=16)
    engine.event("container", "start", cid(6))  # comes after the loop's events
    got = collect(watcher, lambda c: cid(6) in c.seen)
    assert list(got.seen) == [cid(5), cid(6)]  # one entry per container, however many events
    assert got.seen[cid(5)].name == "loop"


def test_a_reconnect_lists_again_and_loses_nothing(engine: FakeEngine, watcher: Watcher) -> None:
    engine.add(cid(1), "web", LABELS, pid=11)
    watcher.start()
    collect(watcher, lambda c: c.listed)
    wait(lambda: engine.streams == 1)
    engine.restart()  # dockerd goes away; meanwhile one container stops, one starts
    del engine.containers[cid(1)]
    engine.add(cid(2), "new", LABELS, pid=12)
    again = collect(watcher, lambda c: c.listed)
    assert set(again.seen) == {cid(2)}  # cid(1) is gone: not in the listing


def test_every_connect_makes_the_engine_load_the_volume_driver(
        engine: FakeEngine, watcher: Watcher) -> None:
    """So that the engine lists it to Swarm, which places tasks with dqoes volumes only on
    nodes whose engine lists the driver."""
    watcher.start()
    wait(lambda: engine.volume_filters == [{"driver": ["dqoes"]}])
    engine.restart()
    wait(lambda: len(engine.volume_filters) == 2)


def test_names_are_known_as_soon_as_the_listing_is(engine: FakeEngine,
                                                    watcher: Watcher) -> None:
    """Whoever takes the listing can look its names up, however long the engine then takes
    to load the volume driver."""
    engine.volumes_delay_s = 2.0
    engine.add(cid(1), "plain", None, pid=11)
    watcher.start()
    collect(watcher, lambda c: c.listed)
    assert watcher.container_id("plain") == cid(1)


def test_service_labels_reach_the_tasks(engine: FakeEngine, watcher: Watcher) -> None:
    task = {"com.docker.swarm.service.id": "svc1", "dqoes.target": "2s"}
    engine.add(cid(1), "tagger.1.x", task, pid=11)
    engine.services = [{"ID": "svc1", "Spec": {"Labels": {"dqoes.target": "1s"}}}]
    watcher.start()
    seen = collect(watcher, lambda c: c.listed).seen[cid(1)]
    assert (seen.objective, seen.source) == (Objective(1.0, "p95"), "service")
    engine.services = [{"ID": "svc1", "Spec": {"Labels": {}}}]
    engine.event("service", "update", "svc1")
    seen = collect(watcher, lambda c: cid(1) in c.seen).seen[cid(1)]
    assert (seen.objective, seen.source) == (Objective(2.0, "p95"), "label")
    # Pushed by another component (a worker node's engine cannot list services).
    watcher.push_service_labels("svc1", {"dqoes.target": "3s", "dqoes.metric": "mean"})
    seen = watcher.take().seen[cid(1)]
    assert (seen.objective, seen.source) == (Objective(3.0, "mean"), "service")


def test_two_hundred_containers_at_once_and_no_fd_leaked(engine: FakeEngine,
                                                          watcher: Watcher) -> None:
    fds = len(os.listdir("/proc/self/fd"))
    watcher.start()
    collect(watcher, lambda c: c.listed)
    for i in range(200):
        engine.add(cid(i), f"c{i}", LABELS, pid=100 + i)
        engine.event("container", "start", cid(i))
    got = collect(watcher, lambda c: len(c.seen) == 200, timeout=120)
    assert all(s is not None and s.objective for s in got.seen.values())
    for _ in range(3):
        engine.restart()
        collect(watcher, lambda c: c.listed and len(c.seen) == 200, timeout=120)
    watcher.close()
    engine.close()
    wait(lambda: len(os.listdir("/proc/self/fd")) <= fds)


def wait(predicate: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_name_asked_of_a_silent_engine_stalls_no_tick(tmp_path: Path,
                                                        engine: FakeEngine) -> None:
    """The loop waits ANSWER_WAIT_S for an answer at most, however long the engine takes;
    a question still out makes the next fail at once."""
    silent = socket.socket(socket.AF_UNIX)
    silent.bind(str(tmp_path / "silent.sock"))
    silent.listen(16)  # connections are queued, never answered
    ask = NameAsker(Engine(tmp_path / "silent.sock", timeout=3600))
    outcome: list[str] = []

    def asking() -> None:
        for _ in range(2):
            with pytest.raises(CgroupError) as e:
                ask("web")
            outcome.append(str(e.value))

    thread = threading.Thread(target=asking, daemon=True)
    thread.start()
    thread.join(60)
    silent.close()
    assert len(outcome) == 2, "the loop waited on a silent engine"
    assert "did not answer within" in outcome[0]
    assert "has not answered the last question yet" in outcome[1]
    engine.add(cid(1), "web", None, pid=11)
    assert NameAsker(Engine(engine.path))("web") == cid(1)
    assert NameAsker(Engine(engine.path))("nosuch") is None


def test_each_subscription_replays_the_second_before_it(engine: FakeEngine,
                                                        watcher: Watcher) -> None:
    """Docker answers before it subscribes: an event between its answer and the listing
    reaches the watcher only as a replay."""
    before = time.time()
    watcher.start()
    collect(watcher, lambda c: c.listed)
    after = time.time()
    since, until = engine.subscriptions[0]
    assert before - 2 <= since <= after - 1 and until - since == SUBSCRIPTION_S + 1


def test_a_change_whose_event_was_dropped_is_made_up_when_a_subscription_ends(
        engine: FakeEngine) -> None:
    engine.add(cid(1), "old", LABELS, pid=11)
    w = Watcher(Engine(engine.path, timeout=5), resolved, lambda v: Path("/vol", v, "ring"),
                subscription_s=1)
    try:
        w.start()
        collect(w, lambda c: c.listed)
        engine.drop = 2  # neither event reaches the watcher
        del engine.containers[cid(1)]
        engine.event("container", "die", cid(1))
        engine.add(cid(2), "new", LABELS, pid=12)
        engine.event("container", "start", cid(2))
        got = collect(w, lambda c: cid(1) in c.seen and cid(2) in c.seen)
        assert got.seen[cid(1)] is None and got.seen[cid(2)].name == "new"
        assert not got.listed, "made up for by a comparison, not a listing of everything"
        assert len(engine.subscriptions) >= 2 and w.connected.is_set()
    finally:
        w.close()


def test_each_outage_is_told_once(engine: FakeEngine, watcher: Watcher,
                                  caplog: pytest.LogCaptureFixture) -> None:
    watcher.start()
    for outage in (1, 2):
        collect(watcher, lambda c: c.listed)
        wait(lambda: engine.streams == 1)
        engine.restart()
        wait(lambda n=outage: sum("stream ended" in r.message for r in caplog.records) == n)
