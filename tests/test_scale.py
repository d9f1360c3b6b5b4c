"""The daemon at scale (finding 13 of issue 17): a request costs the same at any number of
targets, and the loop answers root and keeps ticking whatever a rebuild of its tables or
the look for pending containers costs. bench/scale.py measures it; these tests check the
rules that make it so, on fake cgroup trees (the real kernel adds nothing to them), and
never a duration."""

from __future__ import annotations

import itertools
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bench.cgroups import tmpfs_dir
from bench.dqoesd import Dqoesd
from dqoes_cg import control, jsonline
from dqoes_cg import controller as controller_module
from dqoes_cg.cgroup import resolve_many
from dqoes_cg.config import Config
from dqoes_cg.control import ControlServer, Later, Peer, request
from dqoes_cg.controller import (
    FD_RESERVE,
    FDS_PER_TARGET,
    JOIN_MIN,
    REBUILD_SHARE,
    WALK_SHARE,
)
from dqoes_cg.membership import engine_targets
from dqoes_cg.membership.objective import Objective
from dqoes_cg.membership.targets import ResolveMany, TargetError
from dqoes_cg.policy import Decision, Observation
from lab.fakecg import make_cgroup
from tests.operations import operations
from tests.test_controller import FixedPolicy, Host
from tests.test_engine_targets import StubWatcher, seen

CONTAINER_ID = "ab" * 32


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


@pytest.fixture
def expensive(monkeypatch: pytest.MonkeyPatch) -> float:
    """Every stretch of CPU time the daemon measures (a rebuild, a walk) costs this many
    seconds: the pacing is tested without a big tree or a slow machine."""
    step = 2.0
    clock = itertools.count()
    monkeypatch.setattr(time, "thread_time", lambda: step * next(clock))
    return step


def _controller(host: Host, resolve: ResolveMany) -> controller_module.Controller:
    cfg = Config(mount=host.mount, state_dir=host.tmp / "state", run_dir=host.tmp / "run",
                 cpus=2)
    return controller_module.Controller(cfg, policy=host.policy, resolve=resolve,
                                        threaded_binder=False)


def test_new_targets_join_in_batches_when_a_rebuild_is_expensive(
        host: Host, expensive: float) -> None:
    a, b = "docker/" + "a" * 64, "docker/" + "b" * 64
    c = host.controller()  # its first rebuild "costs" 2 s of CPU
    wait = round(expensive * (1 / REBUILD_SHARE - 1) / c.cfg.sample_interval)
    c.set_target(a, Objective(0.1, "mean"), False)
    for _ in range(wait - 1):
        c.tick(time.monotonic())
        assert c.fleet.names == []  # rebuilding now would exceed its share
    c.tick(time.monotonic())
    assert c.fleet.names == [a]
    c.set_target(b, Objective(0.1, "mean"), False)
    c.tick(time.monotonic())
    assert c.fleet.names == [a]  # b waits for its batch
    # A removal does not wait: nothing may be written to a cgroup given back. b joins with it.
    c.unset_target(a)
    c.tick(time.monotonic())
    assert c.fleet.names == [b]
    c.shutdown()


def test_a_burst_joins_a_bounded_number_at_each_rebuild_in_order(
        host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each new target opens its cgroup's files and its ring: a burst of them joins the
    tables over several rebuilds, as many at each as a share of a tick holds (here none, so
    JOIN_MIN), none lost, the joined ones in the order of the bound ones, and the others
    shown meanwhile as pending."""
    n = 1_000
    monkeypatch.setattr(controller_module, "JOIN_SHARE", 0.0)
    monkeypatch.setattr(engine_targets, "ENGINE_BUDGET_S", 1e9)  # every add in the first tick
    watcher = StubWatcher()
    c = host.controller()
    c.engine_targets.watcher = watcher
    if c.room() < n:
        pytest.skip(f"the open-file limit holds {c.room()} targets, not {n}")
    ids = [f"{k:064x}" for k in range(16, 16 + n)]
    for cid in ids:
        make_cgroup(host.mount, "docker/" + cid)
    watcher.report(*(seen(host, cid, f"c{k}") for k, cid in enumerate(ids)), listed=True)
    joined = [0]
    for _ in range(10 * n // JOIN_MIN):  # a rebuild every tick or few (REBUILD_SHARE)
        c.tick(time.monotonic())
        order = [t.name for t in c.targets.bound()]
        assert len(order) == n and c.fleet.names == order[:len(c.fleet)]
        if len(c.fleet) > joined[-1]:
            joined.append(len(c.fleet))
        if len(joined) == 2:  # answered meanwhile
            classes = [s.cls for s in c.status().containers]
            assert len(classes) == n and classes.count("pending") == n - JOIN_MIN
        if len(c.fleet) == n:
            break
    assert joined == list(range(0, n + 1, JOIN_MIN))
    c.shutdown()


def test_a_burst_that_fits_in_a_share_of_a_tick_joins_at_once(
        host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller_module, "JOIN_SHARE", 1e9)
    monkeypatch.setattr(engine_targets, "ENGINE_BUDGET_S", 1e9)
    watcher = StubWatcher()
    c = host.controller()
    c.engine_targets.watcher = watcher
    ids = [f"{k:064x}" for k in range(16, 16 + 3 * JOIN_MIN)]
    for cid in ids:
        make_cgroup(host.mount, "docker/" + cid)
    watcher.report(*(seen(host, cid, f"c{k}") for k, cid in enumerate(ids)), listed=True)
    c.tick(time.monotonic())
    assert len(c.fleet) == len(ids)
    c.shutdown()


class OnDemandPolicy(FixedPolicy):
    """Runs only when reset (or resized, which implies it), and counts its rounds."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = False
        self.rounds = 0

    def resize(self, n: int, carried: np.ndarray | None = None) -> None:
        super().resize(n, carried)
        self.reset()

    def reset(self) -> None:
        self.asked = True

    def due(self, now: float) -> bool:
        return self.asked

    def decide(self, obs: Observation, now: float) -> Decision:
        self.asked = False
        self.rounds += 1
        return super().decide(obs, now)


def test_a_stream_of_new_targets_does_not_make_the_policy_run_at_every_tick(
        host: Host, expensive: float) -> None:
    policy = OnDemandPolicy()
    c = host.controller(policy)
    c.set_target("docker/" + "a" * 64, Objective(0.1, "mean"), False)
    for k in range(16):  # a new target every tick; they join every 8 ticks
        make_cgroup(host.mount, f"docker/c{k:03d}")
        c.set_target(f"docker/c{k:03d}", Objective(0.1, "mean"), False)
        c.tick(time.monotonic())
    assert len(c.fleet) > 1
    assert policy.rounds <= 3  # when they joined, not 16 times
    c.set_target("docker/" + "a" * 64, Objective(0.2, "mean"), False)  # a new objective: at once
    c.tick(time.monotonic())
    assert policy.rounds <= 4 and not policy.asked
    c.shutdown()


def test_the_look_for_pending_containers_takes_a_bounded_share(
        host: Host, expensive: float, monkeypatch: pytest.MonkeyPatch) -> None:
    looked: list[float] = []
    now = 1000.0

    def resolve(names: list[str]) -> dict:
        looked.append(now)
        return resolve_many(names, host.mount)

    c = _controller(host, resolve)
    c.set_target("web", Objective(0.1, "mean"), True)
    for step in range(30):
        now = 1000.0 + step
        c.tick(now)
    # Each look "costs" 2 s of CPU: the next comes no sooner than 2 s * (1/share - 1).
    spacing = expensive * (1 / WALK_SHARE - 1)
    assert looked[0] == 1000.0
    assert all(later - earlier >= spacing for earlier, later in itertools.pairwise(looked))
    assert len(looked) >= 2  # but it goes on
    c.shutdown()


def test_a_pending_container_name_is_looked_for_by_the_binder_not_the_request(
        host: Host) -> None:
    resolved: list[list[str]] = []

    def resolve(names: list[str]) -> dict:
        resolved.append(list(names))
        return resolve_many(names, host.mount)

    c = _controller(host, resolve)
    listed = c.set_target(CONTAINER_ID, Objective(0.1, "mean"), True)
    assert resolved == []  # no walk of the tree in the request
    assert (listed.state, listed.reason) == ("pending", "not looked for yet")
    with pytest.raises(TargetError, match="not a cgroup, container, unit or PID name"):
        c.set_target("..", Objective(0.1, "mean"), True)  # refused at once all the same
    path = "docker/" + "a" * 64
    c.set_target(path, Objective(0.1, "mean"), True)  # a path costs no walk: resolved at once
    assert resolved == [[path]]
    assert c.describe(path).state == "bound"

    make_cgroup(host.mount, "docker/" + CONTAINER_ID)
    c.tick(time.monotonic())  # the binder finds it, off the request
    assert [CONTAINER_ID] in resolved
    c.tick(time.monotonic())
    assert c.describe(CONTAINER_ID).state == "bound"
    assert sorted(c.fleet.names) == sorted([path, CONTAINER_ID])
    c.shutdown()


def test_nothing_of_a_target_is_kept_once_it_is_unset(host: Host) -> None:
    c = _controller(host, lambda names: resolve_many(names, host.mount))
    for k in range(50):
        path = f"docker/c{k:03d}"
        make_cgroup(host.mount, path)
        for name in (path, f"absent-{k}"):
            c.set_target(name, Objective(0.1, "mean"), name != path)
        c.tick(time.monotonic())
        c.status()
        for name in (path, f"absent-{k}"):
            c.unset_target(name)
    c.tick(time.monotonic())
    assert (len(c.rings), c.targets.reasons, len(c.fleet)) == (0, {}, 0)
    c.shutdown()


def test_targets_beyond_the_open_file_limit_are_refused(
        host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller_module, "open_file_limit",
                        lambda: FD_RESERVE + 2 * FDS_PER_TARGET)
    a, b = "docker/" + "a" * 64, "docker/" + "b" * 64
    c = host.controller()
    c.set_target(a, Objective(0.1, "mean"), False)
    c.set_target("later", Objective(0.1, "mean"), True)  # pending targets hold their place too
    before = host.state()
    with pytest.raises(TargetError, match="no room for more than 2 targets"):
        c.set_target(b, Objective(0.1, "mean"), False)
    assert host.state() == before
    c.set_target(a, Objective(0.2, "mean"), False)  # a new objective for one is still fine
    c.unset_target("later")
    c.set_target(b, Objective(0.1, "mean"), False)  # and a place freed is taken again
    c.shutdown()


def test_a_reply_slower_to_make_than_the_client_deadline_is_sent_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadline is the client's: making a big reply (a status of thousands of
    containers) may take longer than it, and the reply must still go out whole."""
    monkeypatch.setattr(control, "CLIENT_DEADLINE_S", 0.2)
    reply = "x" * (8 << 20)  # many times a socket buffer
    made = threading.Event()

    def slow(op: str, req: dict, peer: Peer) -> str:
        deadline = time.monotonic() + 1.0  # well past the client deadline
        while time.monotonic() < deadline:
            time.sleep(0.05)
        made.set()
        return reply

    with tempfile.TemporaryDirectory() as run:
        server = ControlServer(Path(run) / "s.sock", slow, {"status": False})
        stop = threading.Event()

        def serve() -> None:
            while not stop.is_set():
                server.poll(0.05)

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            assert request(server.path, "status", timeout=60) == reply
            assert made.is_set()
        finally:
            stop.set()
            thread.join()
            server.close()


def test_a_status_costs_the_loop_the_same_work_at_any_number_of_targets(host: Host) -> None:
    """The loop waits for a status (or a list) only while its view of the tables is taken:
    copies of arrays and dictionaries, the same calls whatever the number of targets (the
    work per container, the status made of the view, is done away from the loop)."""
    c = _controller(host, lambda names: resolve_many(names, host.mount))
    calls = {}
    for n in (10, 200):
        while len(c.targets) < 2 * n:
            k = len(c.targets) // 2
            path = f"pods/c{k:03d}"
            make_cgroup(host.mount, path)
            c.set_target(path, Objective(0.1, "mean"), False)
            c.set_target(f"absent-{k}", Objective(0.1, "mean"), True)
        for _ in range(100):
            c.tick(time.monotonic())
            if len(c.fleet) == n:
                break
        assert len(c.fleet) == n
        c.take_view(), c.listings_later()  # anything done once, done
        calls[n] = operations(c.take_view), operations(c.listings_later)
        shown = c.view().status().containers
        assert len(shown) == 2 * n and sum(s.cls == "pending" for s in shown) == n
        assert [t.name for t in c.listings_later()()] == [t.name for t in c.targets]
    assert calls[200] == calls[10]
    c.shutdown()


def test_a_reply_made_away_from_the_loop_lets_it_look_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reply made in the server's thread for replies (`Later`): the loop goes on looking
    while it is made, however long past the client deadline, and then sends it whole."""
    monkeypatch.setattr(control, "CLIENT_DEADLINE_S", 0.2)
    looked = threading.Event()
    reply = "x" * (8 << 20)

    def make() -> str:
        if not looked.wait(120):
            raise AssertionError("the loop did not look while a reply was made")
        return reply

    server = ControlServer(tmp_path / "s.sock", lambda op, req, peer: Later(make),
                           {"status": False})
    got: list[object] = []

    def ask() -> None:
        try:
            got.append(request(server.path, "status", timeout=120))
        except Exception as e:  # shown by the assertion below
            got.append(e)

    client = threading.Thread(target=ask)
    client.start()
    looks = 0
    try:
        while client.is_alive():
            server.poll(0.05)
            looks += 1
            if looks == 20:  # 1 s at least: five client deadlines
                looked.set()
    finally:
        client.join()
        server.close()
    assert got == [reply], str(got)[:200]


def test_a_big_reply_is_encoded_an_item_at_a_time() -> None:
    """A reply made away from the loop is encoded in pieces (each container of a status in
    a call of its own), not in one call that holds the interpreter's lock throughout; the
    bytes are encode's."""
    rows = [{"name": f"c{k}", "class": "S", "pressure": {"cpu": {"some_ratio": None}},
             "x": [1.5, float("nan")]} for k in range(1_000)]
    status = {"version": 1, "ok": True,
              "result": {"host": {"G": 1, "totals": {}}, "containers": rows}}
    for doc in (status, {"version": 1, "ok": True, "result": rows},
                {"version": 1, "ok": False, "error": "bad \u2028 \"name\""},
                {"version": 1, "ok": True, "result": {1: "a", "b": []}}):
        assert jsonline.encode_in_parts(doc) == jsonline.encode(doc)
    assert len(list(jsonline._parts(status, 0))) > len(rows)


def test_a_request_waiting_when_a_tick_overran_is_answered_in_one_look(
        tmp_path: Path) -> None:
    """After a tick longer than the sample interval the loop looks once: a request that
    waited in the backlog is answered in that look, not one tick later."""
    server = ControlServer(tmp_path / "s.sock", lambda op, req, peer: "pong",
                           {"status": False})
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(str(server.path))
        client.sendall(b'{"version": 1, "op": "status"}\n')
        server.poll(-1.0)  # what the loop does after a tick that overran
        reply = client.recv(4096, socket.MSG_DONTWAIT)
        assert json.loads(reply) == {"version": 1, "ok": True, "result": "pong"}
    finally:
        client.close()
        server.close()


def test_a_client_that_does_not_read_its_reply_holds_up_nothing(tmp_path: Path) -> None:
    """A reply many socket buffers long goes out as its client reads it: the look that
    answers returns with the rest still to send (the loop goes on), and the client then
    gets all of it."""
    reply = "x" * (8 << 20)
    server = ControlServer(tmp_path / "s.sock", lambda op, req, peer: reply,
                           {"status": False})
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(str(server.path))
        client.sendall(b'{"version": 1, "op": "status"}\n')
        server.poll(0.0)  # no reader yet: a blocking send would wait here, then drop it
        data = bytearray()
        deadline = time.monotonic() + 120
        while not data.endswith(b"\n"):
            assert time.monotonic() < deadline, f"{len(data)} bytes of the reply came"
            try:
                chunk = client.recv(1 << 20, socket.MSG_DONTWAIT)
            except BlockingIOError:
                chunk = None
            if chunk == b"":
                break  # dropped
            data += chunk or b""
            server.poll(0.0)
        assert json.loads(data)["result"] == reply, f"{len(data)} bytes, then closed"
    finally:
        client.close()
        server.close()


# --- the real daemon ----------------------------------------------------------------------

TARGETS = 300
PENDING = ("absent-1", "absent-2")
TICKS_AFTER = 20


@pytest.fixture
def slow_tree() -> Iterator[tuple[Path, Path]]:
    """A fake cgroup tree with TARGETS cgroups and 20,000 more directories, so that one look
    for a container name costs a walk of them all. Yields (mount, work directory)."""
    with tempfile.TemporaryDirectory(prefix="dqoes-test-scale-", dir=tmpfs_dir()) as tmp:
        work = Path(tmp)
        mount = work / "cgroup"
        for i in range(TARGETS):
            make_cgroup(mount, f"pods/c{i:03d}")
        for i in range(100):
            for j in range(200):
                (mount / f"clutter{i:03d}" / f"g{j:03d}").mkdir(parents=True)
        (work / "daemon").mkdir()
        yield mount, work


def test_root_is_answered_and_ticks_go_on_while_pending_names_are_walked_for(
        slow_tree: tuple[Path, Path]) -> None:
    mount, work = slow_tree
    with Dqoesd(work / "daemon", mount, "--sample-interval", "0.2") as d:
        tasks = Path(f"/proc/{d.proc.pid}/task")
        threads = len(os.listdir(tasks))  # the walk runs in a thread of its own
        names = [f"pods/c{i:03d}" for i in range(TARGETS)]
        for name in names:
            d.request("set-target", container=name, target_s=0.1, metric="mean")
        for name in PENDING:
            d.request("set-target", container=name, target_s=0.1, metric="mean",
                      pending=True)

        def walked() -> bool:
            return all(t["reason"].startswith("no container") for t in d.request("list")
                       if t["name"] in PENDING)

        answered, seen, walked_at = 0, [], None  # seen: when the walk's thread was
        deadline = time.monotonic() + 600
        while walked_at is None or len(d.ticks_between(walked_at, time.monotonic())) \
                < TICKS_AFTER:
            assert time.monotonic() < deadline, d.log_tail()
            # Root's requests, one after the other: every one is answered.
            name = names[answered % TARGETS]
            assert d.request("status", container=name)["containers"][0]["name"] == name
            d.request("set-target", container=name, target_s=0.1 + 0.01 * (answered % 2),
                      metric="mean")
            answered += 1
            if walked_at is None and len(os.listdir(tasks)) > threads:
                seen.append(time.monotonic())
            if walked_at is None and walked():
                walked_at = time.monotonic()
        # The loop ticked while the tree was walked (seconds of CPU), not only after it.
        assert seen, "the walk's thread was never seen"
        during = d.ticks_between(seen[0], walked_at)
        assert during, (seen[0], seen[-1], walked_at, d.ticks_between(seen[0] - 5, walked_at),
                        d.log_tail())
        assert answered >= TICKS_AFTER
        assert d.proc.poll() is None
    assert "Traceback" not in d.log.read_text()


# dqoesd, with each status made only once the loop has ticked SLOW_STATUS_TICKS times more
# than when its view was taken: never, if the loop waits for the status to be made.
SLOW_STATUS_TICKS = 3
_SLOW_STATUS = f"""
import sys, threading
from dqoes_cg import controller, snapshot
ticked, ticks = threading.Condition(), [0]
tick, status = controller.Controller.tick, snapshot.View.status

def counted(self, now):
    tick(self, now)
    with ticked:
        ticks[0] += 1
        ticked.notify_all()

def made_later(self):
    with ticked:
        if not ticked.wait_for(lambda: ticks[0] >= self.host["ticks"] + {SLOW_STATUS_TICKS},
                               timeout=120):
            raise RuntimeError("the loop did not tick while a status was made")
    return status(self)

controller.Controller.tick, snapshot.View.status = counted, made_later
from dqoes_cg.daemon import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_loop_ticks_while_a_status_is_made(tmp_path: Path) -> None:
    mount = tmp_path / "cgroup"
    names = [f"pods/c{i:02d}" for i in range(20)]
    for name in names:
        make_cgroup(mount, name)
    (tmp_path / "daemon").mkdir()
    with Dqoesd(tmp_path / "daemon", mount, "--sample-interval", "0.2",
                command=(sys.executable, "-c", _SLOW_STATUS)) as d:
        for name in names:
            d.request("set-target", container=name, target_s=0.1, metric="mean")
        for _ in range(2):
            shown = d.request("status")
            assert [c["name"] for c in shown["containers"]] == names
            assert d.request("status", container=names[0])["containers"][0]["name"] \
                == names[0]
        assert d.request("list")[0]["name"] == names[0]
        assert d.proc.poll() is None
    assert "Traceback" not in d.log.read_text()
