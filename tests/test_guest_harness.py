"""The test harness itself: the kernel tests see a real cgroup v2 cpu controller, and the
guest's kernel image and initramfs are built correctly."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from lab.guest.elf import ELF_MAGIC, has_pvh_note
from lab.guest.initramfs import module_load_order
from lab.guest.kernel import find_kernel, vmlinux_path
from lab.guest.routing import Route, choose_own_guest_route
from lab.guest.vm import Share, mount_order


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
