"""cpu.weight in proportion to each limit, the actuator's second file, rule by rule on a fake
cgroup tree: written only where it changed, its original journalled before the first write
and given back on unset and stop, re-adopted after a crash, an old state file without
weights loaded, foreign writes counted and a fight left to the other writer, no --weights,
no allocation per decision (the journal, restore, re-adoption and fight rules on real
cgroups too); then on the real kernel: with weights, caps that add up to the CPUs are
delivered to single-threaded loops (bench/packing.py measured why)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from dqoes_cg.actuator import Actuator, weight_of
from dqoes_cg.cgtable import LEAVE_ALONE, WEIGHT_UNKNOWN, CgroupTable, Status
from dqoes_cg.membership.objective import Objective
from dqoes_cg.state import Originals, StateError
from lab.fakecg import make_cgroup, write
from tests.test_controller import ORIGINAL, Host, KernelHost, _cpu_max

ORIGINAL_WEIGHT = "300"
PERIOD_USEC = 100_000


def _weight(cgroup: Path) -> str:
    """The fake file's first line (the C writer does not truncate, as kernel files need not)."""
    return (cgroup / "cpu.weight").read_text().split("\n")[0]


class WeightedHost(Host):
    """test_controller's two containers, `a` with a cpu.weight of its own."""

    weights = True

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        write(self.a / "cpu.weight", ORIGINAL_WEIGHT + "\n")


@pytest.fixture
def host(tmp_path: Path) -> WeightedHost:
    return WeightedHost(tmp_path)


@pytest.fixture(params=["fake tree", pytest.param("real cgroup", marks=pytest.mark.kernel)])
def any_host(request: pytest.FixtureRequest, tmp_path: Path) -> Host:
    """The fake tree on this host, and real cgroups (a cgroup v2 kernel: here or the guest),
    `a` with a cpu.weight of its own."""
    if request.param == "fake tree":
        return WeightedHost(tmp_path)
    host = KernelHost(tmp_path, request.getfixturevalue("cgroup2_mount"),
                      request.getfixturevalue("cgroup_root"))
    host.weights = True
    (host.a / "cpu.weight").write_text(ORIGINAL_WEIGHT)
    return host


def _targeted(host: Host, *, weights: bool = True) -> tuple[object, str, str]:
    """A controller with a target on both containers (limit 0.25 of 2 CPUs: weight 50),
    after its first tick."""
    a, b = host.names()
    c = host.controller()
    c.cfg.weights = weights
    c.set_target(a, Objective(0.1, "mean"), False)
    c.set_target(b, Objective(0.1, "mean"), False)
    c.tick(time.monotonic())
    return c, a, b


# --- the table: one C call writes both files ----------------------------------------


def test_the_table_writes_weights_only_where_they_changed(tmp_path: Path) -> None:
    dirs = [make_cgroup(tmp_path, f"c{i}") for i in range(3)]
    with CgroupTable(dirs) as t:
        t.weight[:] = [62, 50, LEAVE_ALONE]
        assert t.apply(-1, np.array([LEAVE_ALONE] * 3)) == 2  # weights only
        assert [_weight(d) for d in dirs] == ["62", "50", "100"]
        assert t.apply() == 0
        t.weight[1] = 51
        assert t.apply() == 1
        assert list(t.last_weight) == [62, 51, WEIGHT_UNKNOWN]
        t.weight[2] = 10_001  # out of cpu.weight's range: refused, that slot only
        assert t.apply() == 0
        assert list(t.weight_apply_status) == [Status.OK, Status.OK, Status.ERROR]
        assert t.error(2, weight=True) == os.strerror(22)
        assert t.error(2) == "ok"  # its cpu.max has no error


def test_the_table_reads_weights_back_and_finds_foreign_ones(tmp_path: Path) -> None:
    dirs = [make_cgroup(tmp_path, f"c{i}") for i in range(2)]
    with CgroupTable(dirs) as t:
        t.weight[:] = [62, 50]
        t.apply(-1, LEAVE_ALONE)
        assert t.read_back(weights=True) == 0
        write(dirs[1] / "cpu.weight", "500\n")
        assert t.read_back() == 0  # cpu.max only: weights not read
        assert t.read_back(weights=True) == 1
        assert list(t.weight_drifted) == [False, True]
        assert t.found_weight[1] == 500
        t.weight[1] = 40  # our next write finds theirs before writing over it
        t.apply()
        assert list(t.weight_foreign) == [False, True] and _weight(dirs[1]) == "40"
        write(dirs[0] / "cpu.weight", "0\n")
        t.read_back(weights=True)
        assert t.weight_read_back_status[0] == Status.MALFORMED


def test_the_weight_of_a_cap() -> None:
    assert [weight_of(c) for c in (1.0, 0.62, 0.004, 2.0, 500.0)] == [100, 62, 1, 200, 10_000]


# --- the rules, through the controller --------------------------------------------


def test_the_original_weight_is_journalled_before_the_first_write_and_given_back(
        any_host: Host) -> None:
    host = any_host
    a, b = host.names()
    c, _, _ = _targeted(host)
    assert _weight(host.a) == _weight(host.b) == "50"  # 0.25 of 2 CPUs: half a CPU
    assert host.state()[a]["original_weight"] == 300
    assert host.state()[b]["original_weight"] == 100
    assert c.unset_target(a) == ORIGINAL
    assert (_cpu_max(host.a), _weight(host.a)) == (ORIGINAL, ORIGINAL_WEIGHT)
    c.shutdown()
    assert _weight(host.b) == "100"  # given back on stop
    assert host.state()[b]["original_weight"] is None  # and forgotten


def test_no_weight_is_written_before_its_original_is_on_disk(
        host: WeightedHost, monkeypatch: pytest.MonkeyPatch) -> None:
    a, _ = host.names()
    c = host.controller()
    c.set_target(a, Objective(0.1, "mean"), False)
    journal = c.targets
    record = journal.record_originals
    seen: list[str] = []

    def record_then_look(originals: dict[str, Originals]) -> None:
        seen.append(_weight(host.a))  # what the file holds while its original is saved
        record(originals)

    monkeypatch.setattr(journal, "record_originals", record_then_look)
    c.tick(time.monotonic())
    assert seen == [ORIGINAL_WEIGHT] and _weight(host.a) == "50"


def test_no_weight_is_written_when_its_original_cannot_be_saved(
        host: WeightedHost, monkeypatch: pytest.MonkeyPatch) -> None:
    a, _ = host.names()
    c = host.controller()
    c.set_target(a, Objective(0.1, "mean"), False)

    def full(originals: dict[str, Originals]) -> None:
        raise StateError("cannot write the state log: No space left on device")

    monkeypatch.setattr(c.targets, "record_originals", full)
    c.tick(time.monotonic())
    assert (_cpu_max(host.a), _weight(host.a)) == (ORIGINAL, ORIGINAL_WEIGHT)
    monkeypatch.undo()
    c.tick(time.monotonic())
    assert _weight(host.a) == "50"
    c.shutdown()
    assert _weight(host.a) == ORIGINAL_WEIGHT


def test_a_restarted_daemon_finds_its_own_weights(any_host: Host,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    host = any_host
    _targeted(host)  # then a crash: no shutdown, the weights stay
    host.policy.limit = 0.5
    again = host.controller()
    assert again.actuator.table.last_weight.tolist() == [50, 50]  # ours, re-adopted
    again.tick(time.monotonic())
    assert _weight(host.a) == "100"  # a cap of one CPU
    assert "someone else" not in caplog.text
    again.shutdown()
    assert (_weight(host.a), _weight(host.b)) == (ORIGINAL_WEIGHT, "100")  # not ours


def test_a_state_file_without_weights_still_loads(host: WeightedHost) -> None:
    """A daemon of before weights (state version 3) limited `a` and crashed; this one
    re-adopts its limit, saves the weight's original before its first weight write, and
    gives both back."""
    a, _ = host.names()
    c = host.controller()
    c.cfg.weights = False
    c.set_target(a, Objective(0.1, "mean"), False)
    c.tick(time.monotonic())
    c.targets.store.close()
    state = host.tmp / "state" / "state.json"
    doc = {"version": 3, "targets": [
        {k: v for k, v in t.items() if k != "original_weight"} for t in host.state().values()]}
    state.write_text(json.dumps(doc))
    (host.tmp / "state" / "state.log").write_bytes(b"")
    assert _weight(host.a) == ORIGINAL_WEIGHT  # without --weights, left alone
    again = host.controller()
    assert again.actuator.limit.tolist() == [0.25]  # its limit re-adopted
    again.tick(time.monotonic())
    assert host.state()[a]["original_weight"] == 300
    assert _weight(host.a) == "50"
    again.shutdown()
    assert (_cpu_max(host.a), _weight(host.a)) == (ORIGINAL, ORIGINAL_WEIGHT)


def test_a_foreign_weight_is_counted_rewritten_and_a_fight_left_alone(
        any_host: Host, caplog: pytest.LogCaptureFixture) -> None:
    host = any_host
    a, _ = host.names()
    c = host.controller()
    c.set_target(a, Objective(0.1, "mean"), False)
    now = time.monotonic()
    c.tick(now)
    write(host.a / "cpu.weight", "500\n")
    c.tick(now + 1)  # the reconcile (every tick here) finds it and writes ours again
    assert _weight(host.a) == "50"
    assert "cpu.weight was changed to '500' by someone else" in caplog.text
    assert c.status().containers[0].foreign_writes == 1
    for k in range(2):  # two more within a minute: a fight
        write(host.a / "cpu.weight", "500\n")
        c.tick(now + 2 + k)
    assert "cpu.weight rewritten by someone else 3 times" in caplog.text
    assert c.status().containers[0].contested
    host.policy.limit = 0.3
    c.tick(now + 5)
    assert (_cpu_max(host.a), _weight(host.a)) == ("60000 100000", "500")  # cpu.max still ours
    c.unset_target(a)
    assert (_cpu_max(host.a), _weight(host.a)) == (ORIGINAL, "500")  # theirs, not restored


def test_no_weights_leaves_cpu_weight_alone(host: WeightedHost) -> None:
    a, _ = host.names()
    c, _, _ = _targeted(host, weights=False)
    assert _cpu_max(host.a) == "50000 100000"
    assert (_weight(host.a), _weight(host.b)) == (ORIGINAL_WEIGHT, "100")
    assert host.state()[a]["original_weight"] is None
    write(host.a / "cpu.weight", "700\n")
    c.tick(time.monotonic())
    assert c.status().containers[0].foreign_writes == 0
    c.shutdown()
    assert _weight(host.a) == "700"


class MemoryJournal:
    def record_originals(self, originals: dict[str, Originals]) -> None:
        pass

    def forget_originals(self, names: list[str]) -> None:
        pass


ARRAY_BYTES = 16_000  # below one int64 array of the test's 2,000 slots


def test_a_decision_and_a_reconcile_allocate_no_array(tmp_path: Path) -> None:
    n = 2_000
    dirs = [make_cgroup(tmp_path, f"c{i}") for i in range(n)]
    with CgroupTable(dirs) as table:
        actuator = Actuator(table, [f"c{i}" for i in range(n)], [Originals(None, None)] * n,
                            2.0, MemoryJournal(), weights=True, period_usec=PERIOD_USEC,
                            reconcile_interval=0.0, limiter=None, mount=tmp_path)
        limits = np.linspace(0.01, 0.5, n)
        actuator.apply(limits, 0.0)  # the first write journals every original
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for k in range(1, 4):
                limits *= 1.1  # every limit and weight moves
                actuator.apply(limits, float(k))
                actuator.reconcile(float(k))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert _weight(dirs[-1]) == str(weight_of(0.5 * 1.1**3 * 2))
    assert peak - base < ARRAY_BYTES


# --- real cgroup v2 (kernel) ----------------------------------------------------------

CAPS = (0.62, 0.51, 0.37, 0.28, 0.21)  # CPUs of 2: admit's caps in the real run r4
DELIVERED = 0.93  # the largest cap's share it must get with weights (0.86-0.88 without)
WINDOW_S = 10.0
DEADLINE_S = 240.0


def _delivered(table: CgroupTable, seconds: float) -> np.ndarray:
    """The CPUs each slot used over the next `seconds`."""
    table.sample()
    start, t0 = table.usage_usec.astype(np.float64), time.monotonic()
    time.sleep(seconds)
    table.sample()
    return (table.usage_usec - start) / 1e6 / (time.monotonic() - t0)


def _largest_share(table: CgroupTable, caps: np.ndarray) -> float:
    """The share of its cap the loop with the largest cap gets over the next WINDOW_S."""
    top = int(np.argmax(caps))
    return float(_delivered(table, WINDOW_S)[top] / caps[top])


@pytest.mark.kernel
def test_weights_deliver_caps_that_add_up_to_the_cpus(cgroup2_mount: Path,
                                                      cgroup_root: Path) -> None:
    cpus = os.cpu_count() or 1
    caps = np.array(CAPS) * cpus / 2  # adding up to 0.995 of the CPUs
    dirs = [cgroup_root / f"w{i}" for i in range(len(caps))]
    loops = []
    for d in dirs:
        d.mkdir()
        script = f"echo $$ > {d / 'cgroup.procs'} && exec sh -c 'while :; do :; done'"
        loops.append(subprocess.Popen(["sh", "-c", script]))
    shares: dict[bool, list[float]] = {}
    try:
        for weights in (False, True):
            with CgroupTable(dirs) as table:
                actuator = Actuator(table, [d.name for d in dirs],
                                    [Originals(None, None)] * len(dirs), cpus,
                                    MemoryJournal(), weights=weights, period_usec=PERIOD_USEC,
                                    reconcile_interval=2.0, limiter=None, mount=cgroup2_mount)
                actuator.apply(caps / cpus, time.monotonic())
                assert [_weight(d) for d in dirs] == [
                    str(weight_of(c)) if weights else "100" for c in caps]
                time.sleep(3.0)  # the scheduler settles
                # Without weights: three windows for the figure; with them: until delivered.
                shares[weights] = [_largest_share(table, caps)]
                deadline = time.monotonic() + DEADLINE_S
                while (len(shares[weights]) < 3 if not weights else
                       shares[weights][-1] < DELIVERED and time.monotonic() < deadline):
                    shares[weights].append(_largest_share(table, caps))
                actuator.restore(np.ones(len(dirs), bool))
                assert {_weight(d) for d in dirs} == {"100"}
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    print(f"largest cap {caps.max():.2f} CPU, its share per {WINDOW_S:g} s window: "
          f"equal weights {[round(s, 3) for s in shares[False]]}, "
          f"weights in proportion {[round(s, 3) for s in shares[True]]}")
    assert shares[True][-1] >= DELIVERED, shares
