"""The test harness itself: the kernel tests see a real cgroup v2 cpu controller, and the
guest's kernel image and initramfs are built correctly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lab.guest.elf import ELF_MAGIC, has_pvh_note
from lab.guest.initramfs import module_load_order
from lab.guest.kernel import find_kernel, vmlinux_path
from lab.guest.routing import (
    GuestChain,
    GuestRebootWarning,
    GuestRunner,
    Route,
    choose_own_guest_route,
)
from lab.guest.vm import (
    GuestBootTimeout,
    GuestConfig,
    GuestError,
    GuestStopped,
    Share,
    mount_order,
)
from lab.shell import wait_for

REPO = Path(__file__).resolve().parent.parent


def _cpu_stat(cgroup: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in (cgroup / "cpu.stat").open())}


@pytest.mark.kernel
def test_child_cgroup_has_cpu_files(cgroup_root: Path) -> None:
    child = cgroup_root / "child"
    child.mkdir()
    assert (child / "cpu.max").read_text() == "max 100000\n"
    assert "usage_usec" in _cpu_stat(child)


@pytest.mark.kernel
def test_cpu_max_reads_back(cgroup_root: Path) -> None:
    child = cgroup_root / "child"
    child.mkdir()
    (child / "cpu.max").write_text("50000 100000")
    assert (child / "cpu.max").read_text() == "50000 100000\n"


@pytest.mark.kernel
def test_busy_process_is_throttled(cgroup_root: Path) -> None:
    child = cgroup_root / "child"
    child.mkdir()
    (child / "cpu.max").write_text("10000 100000")  # 10 % of one CPU
    before = _cpu_stat(child)["nr_throttled"]
    busy = subprocess.Popen(
        ["sh", "-c", "while :; do :; done"],
        preexec_fn=lambda: (child / "cgroup.procs").write_text("0"),  # join before exec
    )
    try:
        deadline = time.monotonic() + 30  # a bound against hanging, not a speed check
        while _cpu_stat(child)["nr_throttled"] <= before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _cpu_stat(child)["nr_throttled"] > before
    finally:
        busy.kill()
        busy.wait()


def test_vmlinux_is_elf_with_pvh_note() -> None:
    kernel = find_kernel()
    if kernel is None:
        pytest.skip("no Debian kernel in /boot (linux-image-amd64)")
    image = vmlinux_path(kernel).read_bytes()
    assert image.startswith(ELF_MAGIC)
    assert has_pvh_note(image)


def test_initramfs_modules_load_dependencies_first() -> None:
    kernel = find_kernel()
    if kernel is None:
        pytest.skip("no Debian kernel in /boot (linux-image-amd64)")
    names = [Path(rel).name.split(".ko")[0] for rel in module_load_order(kernel)]
    for before, after in [("virtio", "virtio_mmio"), ("9pnet", "9pnet_virtio"), ("9pnet", "9p")]:
        if before in names:  # absent if built in
            assert names.index(before) < names.index(after)
    assert "overlay" in names or "overlay" in (kernel.modules / "modules.builtin").read_text()


def test_a_writable_share_inside_the_job_directory_is_mounted_after_it() -> None:
    """A checkout under /tmp is shared read-only at its path; the demo's output directory
    inside it, writable, must be mounted after it, not hidden by it."""
    out = Share("rw0", Path("/tmp/checkout/demo-output"), writable=True)
    job = Share("workdir", Path("/tmp/checkout"))
    ctl = Share("ctl", Path("/tmp/dqoes-guest-x"), writable=True)
    assert mount_order([ctl, out, job]) == (ctl, job, out)


@pytest.mark.parametrize(("env", "where"), [
    ({"DQOES_GUEST_OWN": "1", "DQOES_GUEST": "1"}, "host"),  # its own guest's test run
    ({"DQOES_GUEST": "1"}, "skip"),  # another guest
    ({"DQOES_TEST_GUEST": "0"}, "skip"),
    ({}, "guest"),
])
def test_tests_of_a_guest_of_their_own_go_there(monkeypatch: pytest.MonkeyPatch,
                                                env: dict[str, str], where: str) -> None:
    for name in ("DQOES_GUEST_OWN", "DQOES_GUEST", "DQOES_TEST_GUEST"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    route = choose_own_guest_route("DQOES_GUEST_OWN", "own guest", lambda: [], "why")
    assert route.where == where, route


def test_tests_of_a_guest_this_host_cannot_boot_are_skipped_with_what_is_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DQOES_GUEST_OWN", "DQOES_GUEST", "DQOES_TEST_GUEST"):
        monkeypatch.delenv(name, raising=False)
    route = choose_own_guest_route("DQOES_GUEST_OWN", "own guest",
                                   lambda: ["docker.io", "pyroute2 (pip)"], "why")
    assert route == Route("skip", "no own guest: missing docker.io, pyroute2 (pip) "
                                  "(`make deps` installs them)")


_HUNG_SESSION = """
import subprocess, time

def test_hangs_in_a_child():
    subprocess.run(["sleep", "600"])

def test_runs_after_it():
    pass
"""


def test_a_hung_test_fails_alone_showing_where_it_hung(tmp_path: Path) -> None:
    """The guest's limit for one test (report.py) ends a hung test with its stacks and
    children, and the session goes on."""
    (tmp_path / "test_hung.py").write_text(_HUNG_SESSION)
    plugin = tmp_path / "limit_plugin.py"
    plugin.write_text("from lab.guest.report import TimeLimit\n"
                      "def pytest_configure(config):\n"
                      "    config.pluginmanager.register(TimeLimit(2.0), 'limit')\n")
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "limit_plugin",
         "--rootdir", str(tmp_path), str(tmp_path / "test_hung.py")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}"})
    assert time.monotonic() - started < 300
    assert "1 failed, 1 passed" in result.stdout, result.stdout + result.stderr
    assert "ran past 2 s, the limit for one test in the guest" in result.stdout
    assert "test_hangs_in_a_child" in result.stdout and "--- no other thread" in result.stdout
    assert "sleep 600" in result.stdout  # the child, with its state and wait channel


class _StoppingGuest:
    """Stands for Guest: reports the first `reports` of its tests, then stops as a whole;
    appends the tests it was given to `started`."""

    def __init__(self, reports: int, ctl_dir: Path, started: list[list[str]],
                 error: GuestError | None = None) -> None:
        self.ctl_dir, self._reports, self._started = ctl_dir, reports, started
        self._error = error or GuestStopped("the guest stopped: no heartbeat for 601 s\n(console)")

    def start(self, argv: list[str], **_: object) -> None:
        nodeids = [a for a in argv if "::" in a]
        self._started.append(nodeids)
        with (self.ctl_dir / "results.jsonl").open("w") as f:
            for nodeid in nodeids[:self._reports]:
                f.write(json.dumps({"nodeid": nodeid, "outcome": "passed", "duration": 1.0})
                        + "\n")

    def poll(self) -> int | None:
        raise self._error

    def close(self) -> None:
        pass


@pytest.mark.parametrize("reports", [[1, 5], [1, 0]], ids=["the new guest", "both stop"])
def test_a_stopped_guest_is_replaced_once_by_one_running_what_it_had_not_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reports: list[int]) -> None:
    """The real path is shown by stopping qemu (SIGSTOP) mid-session: see the guest README."""
    guests, started = iter(reports), []

    def make(_config: GuestConfig) -> _StoppingGuest:
        ctl = tmp_path / f"guest{len(started)}"
        ctl.mkdir()
        return _StoppingGuest(next(guests), ctl, started)

    monkeypatch.setattr("lab.guest.routing.Guest", make)
    ids = [f"tests/t.py::test_{i}" for i in range(4)]
    runner = GuestRunner(tmp_path, ids)
    with pytest.warns(GuestRebootWarning, match=r"runs the 3 tests it had not reported, from "
                                                r"tests/t.py::test_1 on"):
        assert runner.result(ids[0])["outcome"] == "passed"
        if reports[1]:
            assert [runner.result(i)["outcome"] for i in ids[1:]] == ["passed"] * 3
        else:
            with pytest.raises(GuestError, match="no heartbeat"):
                runner.result(ids[1])
            with pytest.raises(GuestError, match="failed earlier: the guest stopped"):
                runner.result(ids[2])
    assert started == [ids, ids[1:]]


def test_a_guest_that_did_not_boot_is_replaced_once_by_one_running_all_its_tests(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two guests booting beside each other on a busy host: one did not start its job
    within 60 s, once in about a dozen boots."""
    started: list[list[str]] = []
    did_not_boot = GuestBootTimeout("guest did not boot within 60 s\n(console)")
    kinds = iter([(0, did_not_boot), (5, None)])

    def make(_config: GuestConfig) -> _StoppingGuest:
        ctl = tmp_path / f"guest{len(started)}"
        ctl.mkdir()
        reports, error = next(kinds)
        return _StoppingGuest(reports, ctl, started, error)

    monkeypatch.setattr("lab.guest.routing.Guest", make)
    ids = [f"tests/t.py::test_{i}" for i in range(3)]
    runner = GuestRunner(tmp_path, ids)
    with pytest.warns(GuestRebootWarning, match=r"did not boot .* runs the 3 tests"):
        assert [runner.result(i)["outcome"] for i in ids] == ["passed"] * 3
    assert started == [ids, ids]


def test_a_chain_of_guests_boots_each_once_the_one_before_reported_all_its_tests(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The swarm smoke test's guest after the kernel tests' one, each of its own size."""
    events: list[str] = []

    class Reporting(_StoppingGuest):
        def __init__(self, config: GuestConfig) -> None:
            ctl = tmp_path / f"guest{config.memory_mib}"
            ctl.mkdir()
            super().__init__(99, ctl, [])
            self._memory = config.memory_mib

        def start(self, argv: list[str], **kwargs: object) -> None:
            events.append(f"boot {self._memory}: {[a for a in argv if '::' in a]}")
            super().start(argv, **kwargs)

        def poll(self) -> int | None:
            return 0

        def close(self) -> None:
            events.append(f"close {self._memory}")

    monkeypatch.setattr("lab.guest.routing.Guest", Reporting)
    monkeypatch.setattr("lab.guest.routing.CHAIN_POLL_S", 0.01)
    kernel, smoke = ["tests/k.py::test_0", "tests/k.py::test_1"], ["tests/s.py::test_smoke"]
    chain = GuestChain([GuestRunner(tmp_path, kernel, GuestConfig(memory_mib=2048)),
                        GuestRunner(tmp_path, smoke, GuestConfig(memory_mib=4096))])
    assert chain.result(kernel[0])["outcome"] == "passed"
    # The next guest boots once the first reported all its tests, before its own are asked
    # for (the host may be waiting on another guest's tests).
    wait_for(lambda: len(events) == 3, 60.0, "the smoke test's guest booted", events.copy)
    assert events == [f"boot 2048: {kernel}", "close 2048", f"boot 4096: {smoke}"]
    assert [chain.result(n)["outcome"] for n in [kernel[1], *smoke]] == ["passed"] * 2
    # The thread that booted the guest outlives it (the guest dies with it).
    assert any(t.name == "guest-chain" for t in threading.enumerate())
    chain.close()
