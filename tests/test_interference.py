"""What slows a node's containers, sensed by dqoesd: the pressure files of each container
(one C call for all, hostile content refused per file) and of the node, throttling over the
window, hardware counters where the host has them (this one does not: the probe's line, and
the arithmetic on fake counter values), and how status, the metrics and the agent's report
carry them. (The real kernel: test_interference_kernel.py.)"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import struct
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from dqoes_cg import ctl, perfcounters
from dqoes_cg.cgtable import PSI_RESOURCES, CgroupTable, Status
from dqoes_cg.cluster.agent import build_report
from dqoes_cg.cluster.protocol import ContainerReport, ProtocolError, Report, parse
from dqoes_cg.config import Config
from dqoes_cg.controller import Controller
from dqoes_cg.ctl import format_interference
from dqoes_cg.membership.objective import Objective
from dqoes_cg.metrics import render
from dqoes_cg.nodepressure import NodePressure
from dqoes_cg.perfcounters import EVENTS, GROUP_WORDS, HardwareCounters
from dqoes_cg.status import Status as DaemonStatus
from lab.fakecg import make_cgroup, write

CID = "c" * 64


def psi(avg10: str, total: int | str) -> str:
    return (f"some avg10={avg10} avg60=0.00 avg300=0.00 total={total}\n"
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")


# --- each container's pressure files, in one C call ---------------------------------------

def test_stalls_read_every_pressure_file_of_every_slot(tmp_path: Path) -> None:
    a = make_cgroup(tmp_path, "a", cpu_pressure=psi("12.50", 1000),
                    memory_pressure=psi("0.07", 20), io_pressure=psi("100.00", 3))
    b = make_cgroup(tmp_path, "b", cpu_pressure=psi("1.00", 7))
    with CgroupTable([a, b]) as t:
        t.pressure_wanted[:] = [False, True]
        assert t.pressure(stalls=True) == 1
        assert t.stall_usec.tolist() == [[1000, 7], [20, 0], [3, 0]]
        assert t.stall_avg10_centi.tolist() == [[1250, 100], [7, 0], [10000, 0]]
        assert (t.stall_status == Status.OK).all()
        # the policy's request is kept: a's cpu total was read once, for the stalls only
        assert t.pressure_status.tolist() == [Status.SKIPPED, Status.OK]
        assert t.waited_usec.tolist() == [0, 7]


@pytest.mark.parametrize(("content", "status"), [
    (psi("101.00", 5), Status.MALFORMED),  # past 100%
    (psi("1.5", 5), Status.MALFORMED),  # the kernel writes two decimals
    (psi("-1.00", 5), Status.MALFORMED),
    (psi("1.00", "5x"), Status.MALFORMED),
    ("some total=5\n", Status.MALFORMED),
    ("x" * 600, Status.MALFORMED),  # past the bounded buffer
    (None, Status.GONE),
], ids=["over-100", "one-decimal", "negative", "bad-total", "no-avg10", "too-long", "absent"])
def test_a_bad_pressure_file_fails_its_own_reading_alone(tmp_path: Path, content: str | None,
                                                          status: Status) -> None:
    cg = make_cgroup(tmp_path, "a", cpu_pressure=psi("2.00", 40), io_pressure=psi("3.00", 9))
    if content is None:
        (cg / "memory.pressure").unlink()
    else:
        write(cg / "memory.pressure", content)
    with CgroupTable([cg]) as t:
        t.stall_usec[1, 0] = 77
        t.pressure(stalls=True)
        assert t.stall_status[:, 0].tolist() == [Status.OK, status, Status.OK]
        assert t.stall_usec[:, 0].tolist() == [40, 77, 9]  # the bad one keeps its last value
        assert t.pressure_status[0] == Status.OK and t.waited_usec[0] == 40


def test_a_pressure_file_planted_as_a_symlink_is_never_read(tmp_path: Path) -> None:
    cg = make_cgroup(tmp_path, "a")
    write(tmp_path / "elsewhere", psi("50.00", 123))
    (cg / "io.pressure").unlink()
    (cg / "io.pressure").symlink_to(tmp_path / "elsewhere")
    with CgroupTable([cg]) as t:
        t.pressure(stalls=True)
        assert t.stall_status[2, 0] != Status.OK and t.stall_usec[2, 0] == 0


def test_a_rebuilt_table_keeps_each_slots_stalls(tmp_path: Path) -> None:
    a = make_cgroup(tmp_path, "a", io_pressure=psi("1.00", 11))
    b = make_cgroup(tmp_path, "b", io_pressure=psi("1.00", 22))
    with CgroupTable([a, b]) as t:
        t.pressure(stalls=True)
        with CgroupTable([b, a], adopt=t) as again:
            assert again.stall_usec[PSI_RESOURCES.index("io")].tolist() == [22, 11]


# --- over a window, in the controller -----------------------------------------------------

class Due:
    """A policy due at every tick that changes no limit."""

    name = "due"

    def resize(self, n: int, carried: np.ndarray | None = None) -> None:
        self.n = n

    def reset(self) -> None:
        pass

    def due(self, now: float) -> bool:
        return True

    def decide(self, obs: Any, now: float) -> None:
        return None


def test_status_shows_what_slowed_each_container_and_the_node_over_the_window(
        tmp_path: Path) -> None:
    mount = tmp_path / "cgroup"
    quiet = psi("0.00", 0)
    cg = make_cgroup(mount, "docker/" + "a" * 64, cpu_pressure=quiet, memory_pressure=quiet,
                     io_pressure=quiet)
    node = tmp_path / "proc-pressure"
    node.mkdir()
    for r in PSI_RESOURCES:
        write(node / r, psi("0.00", 1_000_000))
    cfg = Config(state_dir=tmp_path / "state", run_dir=tmp_path / "run", mount=mount, cpus=2)
    c = Controller(cfg, policy=Due(), threaded_binder=False)
    c.node_pressure = NodePressure(node)
    c.set_target("a" * 64, Objective(1.0, "mean"), False)
    c.tick(time.monotonic())
    f = c.fleet
    start = float(f.window_start[0])
    c.node_pressure.sample(start)
    # Over 2 s: a task stalled 0.5 s on a CPU, 0.2 s on memory; io unreadable; 5 of 10
    # periods throttled. The node: 1 s on a CPU.
    write(cg / "cpu.pressure", psi("25.00", 500_000))
    write(cg / "memory.pressure", psi("10.00", 200_000))
    write(cg / "io.pressure", "garbage")
    write(cg / "cpu.stat", "usage_usec 2000\nnr_periods 20\nnr_throttled 7\n"
                           "throttled_usec 900\n")
    write(node / "cpu", psi("50.00", 2_000_000))
    f.sense(start + 2.0)
    f.observe_window(start + 2.0)
    c.node_pressure.sample(start + 2.0)
    status = c.status()
    [s] = status.containers
    assert s.pressure["cpu"] == {"some_ratio": pytest.approx(0.25), "avg10_pct": 25.0}
    assert s.pressure["memory"] == {"some_ratio": pytest.approx(0.1), "avg10_pct": 10.0}
    assert s.pressure["io"] == {"some_ratio": None, "avg10_pct": None}
    assert s.throttled_window_ratio == pytest.approx(0.5)
    assert status.host.pressure["cpu"] == {"some_ratio": pytest.approx(0.5), "avg10_pct": 50.0}
    assert status.host.pressure["io"]["some_ratio"] == 0.0
    assert s.ipc is None and status.host.hardware_counters == c.hardware_said
    # io readable again: unknown for the window that ended unknown, known from the next
    write(cg / "io.pressure", psi("0.00", 300_000))
    f.observe_window(start + 4.0)
    assert math.isnan(f.stall_share[2, 0])
    write(cg / "io.pressure", psi("0.00", 700_000))
    f.observe_window(start + 6.0)
    assert f.stall_share[2, 0] == pytest.approx(0.2)
    # the JSON round trip, and what dqoesctl and the metrics make of it
    again = DaemonStatus.from_json(json.loads(json.dumps(c.status().to_json())))
    assert again.containers[0].pressure["io"]["some_ratio"] == pytest.approx(0.2)
    c.shutdown()


def test_node_pressure_is_a_rate_over_the_window_and_a_bad_file_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for r in PSI_RESOURCES:
        write(tmp_path / r, psi("1.00", 1_000_000))
    node = NodePressure(tmp_path)
    node.sample(10.0)
    assert all(math.isnan(x) for x in node.share)  # no window yet
    write(tmp_path / "cpu", psi("30.00", 1_400_000))
    write(tmp_path / "memory", "x" * 1000)
    (tmp_path / "io").unlink()
    (tmp_path / "io").symlink_to(tmp_path / "cpu")  # never followed
    with caplog.at_level(logging.WARNING):
        node.sample(12.0)
        assert node.share[0] == pytest.approx(0.2) and node.avg10[0] == 30.0
        assert math.isnan(node.share[1]) and math.isnan(node.share[2])
        node.sample(14.0)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("\n" not in line for line in lines), lines  # once each


# --- hardware counters ------------------------------------------------------------------

def test_this_host_says_in_one_line_whether_it_has_hardware_counters(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        counters, said = HardwareCounters.start()
    assert [r.getMessage() for r in caplog.records] == [said]
    if counters is None:  # these hosts (a VM, a TCG guest): why, and what is used instead
        assert said.startswith("perf_event_open: E") and said.endswith(
            "interference is judged from pressure and throttling alone"), said
    else:
        counters.close()


def _group(enabled: float, running: float, cycles: float, instructions: float,
           misses: float, nr: int = len(EVENTS)) -> bytes:
    return struct.pack(f"={GROUP_WORDS}Q", nr, *(int(x) for x in
                                                  (enabled, running, cycles, instructions,
                                                   misses)))


class FakeGroups:
    """CounterGroups whose leaders are pipes (counters faked present): each CPU's next
    reading is what the test writes into its pipe, and a pipe left empty is unreadable."""

    opened: ClassVar[dict[str | None, FakeGroups]] = {}
    refuse: ClassVar[int | None] = None

    def __init__(self, cgroup: Path | None, cpus: int) -> None:
        if cgroup is not None and FakeGroups.refuse is not None:
            raise OSError(FakeGroups.refuse, "refused")
        pipes = [os.pipe() for _ in range(cpus)]
        for r, _ in pipes:
            os.set_blocking(r, False)
        self.leaders = [r for r, _ in pipes]
        self._writers = [w for _, w in pipes]
        self.closed = False
        FakeGroups.opened[None if cgroup is None else cgroup.name] = self

    def next_reading(self, *per_cpu: bytes) -> None:
        for w, reading in zip(self._writers, per_cpu, strict=True):
            os.write(w, reading)

    def counts(self, cycles: float, instructions: float, misses: float) -> None:
        """The same counts on every CPU, unmultiplexed."""
        self.next_reading(*[_group(1, 1, cycles, instructions, misses)] * len(self.leaders))

    def close(self) -> None:
        for fd in self.leaders + self._writers:
            os.close(fd)
        self.closed = True


@pytest.fixture
def fake_groups(monkeypatch: pytest.MonkeyPatch) -> type[FakeGroups]:
    FakeGroups.opened, FakeGroups.refuse = {}, None
    monkeypatch.setattr(perfcounters, "probe", lambda: None)
    monkeypatch.setattr(perfcounters, "CounterGroups", FakeGroups)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    return FakeGroups


def test_counters_per_container_over_the_window(fake_groups: type[FakeGroups]) -> None:
    counters, said = HardwareCounters.start()
    assert counters is not None and said.startswith("hardware counters")
    counters.follow({"web": Path("/cg/web"), "db": Path("/cg/db")})
    for g in fake_groups.opened.values():
        g.counts(0, 0, 0)
    counters.sample(0.0)
    assert math.isnan(counters.ipc["web"])  # no window yet
    fake_groups.opened["web"].counts(1e9, 1.5e9, 2e6)  # summed over its two CPUs
    fake_groups.opened["db"].counts(0.5e9, 0.25e9, 4e6)
    counters.sample(2.0)
    assert counters.ipc == {"web": pytest.approx(1.5), "db": pytest.approx(0.5)}
    assert counters.llc_misses_per_s == {"web": pytest.approx(2e6), "db": pytest.approx(4e6)}
    counters.follow({"db": Path("/cg/db"), "api": Path("/cg/api")})  # web left, api came
    fake_groups.opened["db"].counts(1.5e9, 0.75e9, 4e6)
    fake_groups.opened["api"].counts(1e9, 1e9, 0)
    counters.sample(4.0)
    assert fake_groups.opened["web"].closed and set(counters.ipc) == {"db", "api"}
    assert counters.ipc["db"] == pytest.approx(0.5)  # db's window went on across the change
    assert math.isnan(counters.ipc["api"])  # api's first reading
    counters.close()


def test_a_reading_that_is_not_a_window_of_counts_gives_none(
        fake_groups: type[FakeGroups], caplog: pytest.LogCaptureFixture) -> None:
    counters, _ = HardwareCounters.start()
    assert counters is not None
    names = ("good", "wrong-group", "short", "went-back")
    counters.follow({n: Path(f"/cg/{n}") for n in names})
    for g in fake_groups.opened.values():
        g.counts(1e9, 1e9, 1e6)
    counters.sample(0.0)
    g = fake_groups.opened
    g["good"].counts(2e9, 2e9, 2e6)
    g["wrong-group"].next_reading(*[_group(1, 1, 2e9, 2e9, 2e6, nr=2)] * 2)
    g["short"].next_reading(_group(1, 1, 2e9, 2e9, 2e6), _group(1, 1, 2e9, 2e9, 2e6)[:8])
    g["went-back"].counts(2e9, 0.5e9, 2e6)
    with caplog.at_level(logging.WARNING):
        counters.sample(1.0)
        assert counters.ipc["good"] == pytest.approx(1.0)
        assert all(math.isnan(counters.ipc[n]) for n in names[1:])
        counters.sample(2.0)  # every pipe empty: all unreadable, the line held back
    assert all(math.isnan(v) for v in counters.ipc.values())
    assert len(caplog.records) == 1 and "groups unreadable" in caplog.text
    counters.close()


def test_a_window_with_a_multiplexed_cpu_counts_it_scaled(fake_groups: type[FakeGroups]
                                                          ) -> None:
    counters, _ = HardwareCounters.start()
    assert counters is not None
    counters.follow({"scaled": Path("/cg/scaled"), "never-ran": Path("/cg/never-ran")})
    for g in fake_groups.opened.values():
        g.counts(1e9, 1e9, 1e6)
    counters.sample(0.0)
    g = fake_groups.opened
    g["scaled"].next_reading(_group(4, 1, 0.5e9, 0.25e9, 0.5e6), _group(1, 1, 1e9, 1e9, 1e6))
    g["never-ran"].next_reading(*[_group(1, 0, 9e9, 9e9, 9e9)] * 2)
    counters.sample(1.0)
    # cycles 4 * 0.5e9 + 1e9 = 3e9 (from 2e9), instructions 1e9 + 1e9 = 2e9 (from 2e9)
    assert counters.ipc["scaled"] == pytest.approx(0.0)
    assert counters.llc_misses_per_s["scaled"] == pytest.approx(1e6)
    assert math.isnan(counters.ipc["never-ran"])  # counted as zeros: its counters went back
    counters.close()


def test_a_refused_cgroup_mode_counts_the_node_instead(fake_groups: type[FakeGroups],
                                                       caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    counters, _ = HardwareCounters.start()
    assert counters is not None
    fake_groups.refuse = errno.EINVAL
    with caplog.at_level(logging.WARNING):
        counters.follow({"web": Path("/cg/web")})
        counters.follow({"web": Path("/cg/web"), "db": Path("/cg/db")})  # stays per node
    assert counters.per_node and list(fake_groups.opened) == [None]
    assert len(caplog.records) == 1 and "the node's are counted" in caplog.text
    fake_groups.opened[None].counts(0, 0, 0)
    counters.sample(1.0)
    fake_groups.opened[None].counts(2e9, 1e9, 0)
    counters.sample(2.0)
    assert counters.ipc == {HardwareCounters.NODE: 0.5}
    assert counters.llc_misses_per_s == {HardwareCounters.NODE: 0.0}
    counters.close()


# --- dqoesctl, the metrics, the agent's report ---------------------------------------------

def _stalls(cpu: float | None, memory: float | None = 0.0, io: float | None = 0.0
            ) -> dict[str, dict[str, float | None]]:
    return {r: {"some_ratio": v, "avg10_pct": None if v is None else v * 100}
            for r, v in zip(PSI_RESOURCES, (cpu, memory, io), strict=True)}


STATUS = DaemonStatus.from_json({
    "host": {"G": 0, "S": 1, "B": 0, "idle": 0, "pending": 0, "policy": "admit",
             "interval_s": 10.0, "last_decision_age_s": 1.0, "last_decision_unix": 1.7e9,
             "budget_cpus": 2.0, "ticks": 9, "decisions": 1, "reconcile_corrections": 0,
             "ring_faults": 0, "ring_lost": 0, "pressure": _stalls(0.42, 0.01, None),
             "hardware_counters": "perf_event_open: ENOENT — this host exposes no hardware "
                                  "counters; interference is judged from pressure and "
                                  "throttling alone"},
    "containers": [{"name": "web", "class": "S", "target_s": 0.04, "metric": "p95",
                    "measured_s": 0.04, "q_s": 0.0, "cpu_limit_cores": 0.5,
                    "cpu_usage_cores": 0.5, "throttled_ratio": 0.3, "samples": 10,
                    "cgroup": "/cg/web", "ring": "/run/dqoes/web", "pressure": _stalls(0.25),
                    "throttled_window_ratio": 0.125}]})


def test_dqoesctl_status_interference() -> None:
    text = format_interference(STATUS)
    lines = text.splitlines()
    assert lines[0] == ("node pressure (some, last window): cpu 42.0% (avg10 42.0%)  "
                        "memory 1.0% (avg10 1.0%)  io - (avg10 -)")
    assert lines[2].split() == ["CONTAINER", "CPU", "SOME", "MEMORY", "SOME", "IO", "SOME",
                                "THROTTLED"]
    assert lines[3].split() == ["web", "25.0%", "0.0%", "0.0%", "12.5%"]
    assert lines[-1].startswith("perf_event_open: ENOENT")


def test_dqoesctl_status_takes_json_or_interference_not_both(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        ctl.main(["status", "--json", "--interference"])
    assert exit_.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_metrics_carry_the_pressure_and_throttling() -> None:
    text = render(STATUS)[0].decode()
    assert 'dqoes_container_pressure_some_ratio{container="web",resource="cpu"} 0.25' in text
    assert 'dqoes_container_throttled_window_ratio{container="web"} 0.125' in text
    assert 'dqoes_node_pressure_some_ratio{resource="cpu"} 0.42' in text
    assert 'dqoes_node_pressure_some_avg10_percent{resource="io"} NaN' in text
    assert "instructions_per_cycle" not in text.replace("# HELP", "").split("# TYPE")[-1]


def test_the_report_carries_it_and_the_manager_takes_older_reports() -> None:
    report = build_report(4, STATUS, {"web": CID}, None)
    [c] = report.containers
    assert c.pressure["cpu"]["some_ratio"] == 0.25 and c.throttled_window_ratio == 0.125
    assert report.pressure["cpu"]["some_ratio"] == 0.42
    assert parse(json.dumps(report.to_json()).encode()) == report
    # An older agent's report has none of the new fields: taken as knowing none of them.
    doc = report.to_json()
    for key in ("pressure", "ipc", "llc_misses_per_s"):
        del doc[key]
        for container in doc["containers"]:
            container.pop(key)
    doc["containers"][0].pop("throttled_window_ratio")
    old = parse(json.dumps(doc).encode())
    assert isinstance(old, Report) and old.pressure == {} and old.ipc is None
    assert old.containers[0] == ContainerReport(CID, "S", 0.04, "p95", 0.04, 0.5, 0.5, 10)


@pytest.mark.parametrize("change", [
    {"pressure": {"disk": {"some_ratio": 0.1, "avg10_pct": 1.0}}},
    {"pressure": {"cpu": {"some_ratio": 1.5, "avg10_pct": 1.0}}},
    {"pressure": {"cpu": {"some_ratio": 0.1, "avg10_pct": 101}}},
    {"pressure": {"cpu": {"some_ratio": 0.1}}},
    {"pressure": {"cpu": [0.1, 1.0]}},
    {"pressure": "high"},
    {"ipc": -1}, {"ipc": 1e6}, {"ipc": "fast"}, {"llc_misses_per_s": float("inf")},
    {"container": {"throttled_window_ratio": 2}},
    {"container": {"pressure": {"io": {"some_ratio": "x", "avg10_pct": 0}}}},
], ids=str)
def test_a_malformed_interference_field_is_a_protocol_error(change: dict[str, Any]) -> None:
    doc = build_report(4, STATUS, {"web": CID}, None).to_json()
    doc["containers"][0].update(change.pop("container", {}))
    doc.update(change)
    with pytest.raises(ProtocolError):
        parse(json.dumps(doc).encode())
