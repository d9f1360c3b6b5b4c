"""Telling systemd the limits of its units: the D-Bus message, the limiter's thread (latest
request wins, no bus, errors), and which slots the controller hands over, on a fake tree.
That systemd keeps the limits is tested against a real systemd in test_e2e_service.py."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from jeepney import Message, new_error, new_method_return
from jeepney.low_level import HeaderFields

from dqoes_cg.control import Peer
from dqoes_cg.controller import Config, Controller
from dqoes_cg.membership.objective import Objective
from dqoes_cg.policy import Decision, Observation
from dqoes_cg.systemd_units import USEC_INFINITY, UnitLimiter, quota_message
from lab.fakecg import make_cgroup, write

ROOT = Peer(pid=1, uid=0, gid=0)


def test_quota_message_is_a_runtime_set_unit_properties() -> None:
    msg = quota_message("docker-abc.scope", 25_000, 100_000)
    fields = msg.header.fields
    assert fields[HeaderFields.destination] == "org.freedesktop.systemd1"
    assert fields[HeaderFields.path] == "/org/freedesktop/systemd1"
    assert fields[HeaderFields.interface] == "org.freedesktop.systemd1.Manager"
    assert fields[HeaderFields.member] == "SetUnitProperties"
    assert fields[HeaderFields.signature] == "sba(sv)"
    assert msg.body == ("docker-abc.scope", True, [("CPUQuotaPerSecUSec", ("t", 250_000)),
                                                   ("CPUQuotaPeriodUSec", ("t", 100_000))])
    msg.serialise(serial=1)  # the body fits the signature


def test_no_limit_is_infinity() -> None:
    assert quota_message("x.service", -1, 100_000).body[2][0] == (
        "CPUQuotaPerSecUSec", ("t", USEC_INFINITY))


class FakeBus:
    """Records SetUnitProperties calls; `gate` holds each call until set."""

    def __init__(self, fail_units: tuple[str, ...] = ()) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.properties: list[dict[str, tuple[str, int]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_units = fail_units
        self.closed = False

    def send_and_get_reply(self, message: Message, *, timeout: float | None = None) -> Message:
        self.gate.wait(10)
        unit, runtime, props = message.body
        assert runtime is True
        values = dict(props)
        self.properties.append(values)
        self.calls.append((unit, values["CPUQuotaPerSecUSec"][1],
                           values["CPUQuotaPeriodUSec"][1]))
        if unit in self.fail_units:
            return new_error(message, "org.freedesktop.systemd1.NoSuchUnit", "s",
                             (f"Unit {unit} not loaded.",))
        return new_method_return(message)

    def close(self) -> None:
        self.closed = True


def test_the_latest_request_per_unit_wins() -> None:
    bus = FakeBus()
    limiter = UnitLimiter(lambda: bus)
    bus.gate.clear()  # the thread is stuck in the first call while the loop asks again
    limiter.set_quota("a.scope", 10_000, 100_000)
    time.sleep(0.1)
    for quota in (20_000, 30_000, 40_000):
        limiter.set_quota("a.scope", quota, 100_000)
    limiter.set_quota("b.service", -1, 100_000)
    bus.gate.set()
    assert limiter.flush(10)
    assert bus.calls == [("a.scope", 100_000, 100_000), ("a.scope", 400_000, 100_000),
                         ("b.service", USEC_INFINITY, 100_000)]
    limiter.close()
    assert bus.closed and limiter.sent == 3 and limiter.failed == 0


def test_a_refused_call_is_counted_and_the_next_goes_out(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    caplog.set_level(logging.INFO)
    bus = FakeBus(fail_units=("gone.scope",))
    limiter = UnitLimiter(lambda: bus)
    limiter.set_quota("gone.scope", 10_000, 100_000)
    assert limiter.flush(10)
    limiter.set_quota("a.scope", 10_000, 100_000)
    limiter.close()
    assert [c[0] for c in bus.calls] == ["gone.scope", "a.scope"]
    assert (limiter.sent, limiter.failed) == (1, 1)
    assert "gone.scope: systemd refused the CPU limit" in caplog.text


def test_without_a_system_bus_it_logs_once_and_drops(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)

    def no_bus() -> FakeBus:
        raise FileNotFoundError(2, "No such file or directory")

    limiter = UnitLimiter(no_bus)
    for quota in (10_000, 20_000):
        limiter.set_quota("a.scope", quota, 100_000)
        assert limiter.flush(10)
    limiter.close()
    assert caplog.text.count("no system bus") == 1
    assert (limiter.sent, limiter.failed) == (0, 2)


class FixedPolicy:
    """Due at every tick; gives each slot the limit in `limits` (fraction of T_R)."""

    name = "fixed"

    def __init__(self) -> None:
        self.limits = np.zeros(0)

    def resize(self, n: int, carried: np.ndarray | None = None) -> None:
        self.limits = np.full(n, 0.25)

    def reset(self) -> None:
        pass

    def due(self, now: float) -> bool:
        return True

    def decide(self, obs: Observation, now: float) -> Decision:
        n = len(self.limits)
        return Decision(self.limits, np.ones(n, np.int8), np.zeros(n))


def _cpu_max(cgroup: Path) -> str:
    """The fake file's first line: the C writer does not truncate (kernel files need not)."""
    return (cgroup / "cpu.max").read_text().split("\n")[0]


class RecordingLimiter:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.weights: list[tuple[str, int]] = []

    def set_quota(self, unit: str, quota_usec: int, period_usec: int) -> None:
        self.calls.append((unit, quota_usec, period_usec))

    def set_weight(self, unit: str, weight: int) -> None:
        self.weights.append((unit, weight))


def test_the_controller_hands_over_changed_unit_limits_only(tmp_path: Path) -> None:
    mount = tmp_path / "cgroup"
    unit = make_cgroup(mount, "system.slice/infer.service")
    plain = make_cgroup(mount, "docker/" + "a" * 64)
    policy, limiter = FixedPolicy(), RecordingLimiter()
    controller = Controller(Config(mount=mount, state_dir=tmp_path / "state",
                                   run_dir=tmp_path / "run", cpus=2,
                                   reconcile_interval=0.0,  # read back at every tick
                                   weights=True),
                            policy=policy, limiter=limiter)  # type: ignore[arg-type]
    for name in ("system.slice/infer.service", "docker/" + "a" * 64):
        controller.set_target(name, Objective(0.1, "mean"), False)

    controller.tick(time.monotonic())  # 0.25 of 2 CPUs: 50 ms per 100 ms, weight 50
    assert _cpu_max(unit) == "50000 100000"
    assert _cpu_max(plain) == "50000 100000"
    assert limiter.calls == [("infer.service", 50_000, 100_000)]
    assert limiter.weights == [("infer.service", 50)]

    controller.tick(time.monotonic())  # same limit: nothing to tell
    policy.limits[:] = 0.3
    controller.tick(time.monotonic())
    assert limiter.calls[1:] == [("infer.service", 60_000, 100_000)]
    assert limiter.weights[1:] == [("infer.service", 60)]

    # systemd put its own values back (daemon-reload): written again, and told again.
    write(unit / "cpu.max", "max 100000")
    write(unit / "cpu.weight", "100\n")
    controller.tick(time.monotonic())
    assert _cpu_max(unit) == "60000 100000"
    assert _first_line(unit / "cpu.weight") == "60"
    assert limiter.calls[2:] == [("infer.service", 60_000, 100_000)]
    assert limiter.weights[2:] == [("infer.service", 60)]

    controller.shutdown()
    assert _cpu_max(unit) == "max 100000"
    assert limiter.calls[3:] == [("infer.service", -1, 100_000)]
    assert limiter.weights[3:] == [("infer.service", 100)]


def _first_line(path: Path) -> str:
    return path.read_text().split("\n")[0]


def test_a_unit_s_limit_and_weight_go_out_in_one_call() -> None:
    bus = FakeBus()
    limiter = UnitLimiter(lambda: bus)
    bus.gate.clear()  # both requests are pending when the thread takes them
    limiter.set_quota("busy.scope", 10_000, 100_000)
    time.sleep(0.1)
    limiter.set_quota("a.scope", 20_000, 100_000)
    limiter.set_weight("a.scope", 40)
    bus.gate.set()
    assert limiter.flush(10)
    limiter.close()
    assert bus.calls[1:] == [("a.scope", 200_000, 100_000)]
    assert bus.properties[-1] == {"CPUQuotaPerSecUSec": ("t", 200_000),
                                  "CPUQuotaPeriodUSec": ("t", 100_000),
                                  "CPUWeight": ("t", 40)}
