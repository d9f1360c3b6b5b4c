"""Boot a throwaway qemu guest that sees the host's filesystem and runs one job in it.

The guest is qemu's microvm machine under TCG, booting the host's Debian kernel through PVH
with the host's / as a read-only 9p share under a tmpfs overlay (see README.md). Every guest
has a writable control share: a host temporary directory mounted at the same path inside,
holding the job (job.sh), its output (stdout, stderr) and its exit status (exit_code).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from .initramfs import GUEST_DIR, build_initramfs
from .kernel import Kernel, find_kernel, vmlinux_path

QEMU = "qemu-system-x86_64"
MSIZE = 512000  # 9p message size: large reads and writes in few round trips
POLL_INTERVAL = 0.05


class GuestError(RuntimeError):
    """The guest failed to boot, died, or timed out. The message ends with the console log."""


@dataclass(frozen=True)
class Share:
    """A host directory shared into the guest over virtio-9p, by default at the same path.

    Read-only shares use cache=loose (fast; the host is assumed not to change them under a
    running guest); writable shares use cache=none so the host sees every write at once.
    """

    tag: str
    host_path: Path
    guest_path: Path | None = None
    writable: bool = False

    def cmdline(self) -> str:
        mode, cache = ("rw", "none") if self.writable else ("ro", "loose")
        return f"dqoes.share={self.tag}:{self.guest_path or self.host_path}:{mode}:{cache}"

    def qemu_args(self) -> list[str]:
        readonly = "" if self.writable else ",readonly=on"
        return [
            "-fsdev",
            f"local,id={self.tag},path={self.host_path},security_model=none,"
            f"multidevs=remap{readonly}",
            "-device", f"virtio-9p-device,fsdev={self.tag},mount_tag={self.tag}",
        ]


@dataclass(frozen=True)
class InitMode:
    """What runs as PID 1 after stage 1 switches to the overlay root.

    `init` is a program in the guest root (the host's tree) that must honour the job
    protocol of guest-lib.sh (`run_job`) and power the guest off afterwards; `cmdline` holds
    the kernel arguments the mode needs.
    """

    name: str
    init: Path
    cmdline: tuple[str, ...] = ()


BUSYBOX_INIT = InitMode("busybox", GUEST_DIR / "guest-init")

BASE_CMDLINE = (
    "console=ttyS0", "8250.nr_uarts=1", "quiet", "panic=-1", "tsc=reliable", "no_timer_check",
    "mitigations=off", "cryptomgr.notests", "random.trust_cpu=on", "rcupdate.rcu_expedited=1",
    "reboot=t",  # triple fault: a reboot (and panic=-1) always ends qemu (-no-reboot)
)


@dataclass
class GuestConfig:
    """How to boot: everything a later init mode may need to vary is a field."""

    init_mode: InitMode = BUSYBOX_INIT
    cpus: int = 2
    memory_mib: int = 2048
    cmdline_extra: tuple[str, ...] = ()
    shares: tuple[Share, ...] = ()
    boot_timeout: float = 60.0
    kernel: Kernel | None = field(default_factory=find_kernel)


class FileTail:
    """Reads what was appended to a file since the last read (the file may not exist yet)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def read(self, whole_lines: bool = False) -> bytes:
        """The new bytes; with `whole_lines`, only up to the last newline."""
        if not self.path.exists():
            return b""
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        if whole_lines:
            data = data[: data.rfind(b"\n") + 1]
        self._offset += len(data)
        return data


_running: weakref.WeakSet[Guest] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for guest in list(_running):
        guest.close()


class Guest:
    """One guest running one job. Use as a context manager, or call close(): qemu never
    outlives it (nor this process: it gets SIGKILL if we die).

    >>> with Guest() as g:
    ...     code = g.run(["cat", "/sys/fs/cgroup/cgroup.subtree_control"])
    """

    def __init__(self, config: GuestConfig | None = None) -> None:
        self.config = config or GuestConfig()
        if self.config.kernel is None:
            raise GuestError("no kernel to boot: install linux-image-amd64")
        self.ctl_dir = Path(tempfile.mkdtemp(prefix="dqoes-guest-"))
        self.console_log = self.ctl_dir / "console.log"
        self._qemu: subprocess.Popen[bytes] | None = None
        self._tails: list[_Tail] = []
        self._launched = self._started = 0.0
        self._run_timeout: float | None = None
        self.boot_seconds: float | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(
        self,
        argv: Sequence[str],
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        run_timeout: float | None = None,
        stdout: BinaryIO | None = None,
        stderr: BinaryIO | None = None,
    ) -> None:
        """Boot the guest and run `argv` in `cwd` (default: ours) with `env` (default: ours)
        plus DQOES_GUEST=1. Output is copied to `stdout`/`stderr` as poll() sees it."""
        env = {**(os.environ if env is None else env), "DQOES_GUEST": "1"}
        self._write_job(argv, Path(cwd or os.getcwd()), env)
        self._tails = [
            _Tail(self.ctl_dir / "stdout", stdout),
            _Tail(self.ctl_dir / "stderr", stderr),
        ]
        self._run_timeout = run_timeout
        kernel = self.config.kernel
        assert kernel is not None
        initrd = self.ctl_dir / "initramfs.cpio"
        initrd.write_bytes(build_initramfs(kernel))
        command = qemu_command(self.config, vmlinux_path(kernel), initrd, self.console_log,
                               self.shares)
        with (self.ctl_dir / "qemu.log").open("wb") as qemu_log:
            self._qemu = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=qemu_log, stderr=qemu_log,
                preexec_fn=_die_with_parent,
            )
        self._launched = time.monotonic()
        _running.add(self)

    def poll(self) -> int | None:
        """Copy new output; the job's exit status once it has one, else None.
        Raises GuestError if the guest died first or a timeout passed."""
        assert self._qemu is not None, "start() first"
        self._pump()
        exit_code = self.ctl_dir / "exit_code"
        if exit_code.exists():
            return int(exit_code.read_text())
        now = time.monotonic()
        if not self._started and (self.ctl_dir / "started").exists():
            self._started = now
            self.boot_seconds = now - self._launched
        if self._qemu.poll() is not None:
            self._pump()
            phase = "running the command" if self._started else "booting"
            raise self.error(f"guest exited (qemu status {self._qemu.returncode}) while {phase}")
        if not self._started and now - self._launched > self.config.boot_timeout:
            raise self.error(f"guest did not boot within {self.config.boot_timeout:.0f} s")
        if self._started and self._run_timeout and now - self._started > self._run_timeout:
            raise self.error(f"command did not finish within {self._run_timeout:.0f} s")
        return None

    def wait(self) -> int:
        """Block until the job ends; its exit status."""
        while (code := self.poll()) is None:
            time.sleep(POLL_INTERVAL)
        return code

    def run(
        self,
        argv: Sequence[str],
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        run_timeout: float | None = None,
        stdout: BinaryIO | None = None,
        stderr: BinaryIO | None = None,
    ) -> int:
        """start() and wait(): run `argv` in the guest, streaming its output to ours."""
        self.start(
            argv, cwd, env, run_timeout,
            stdout or sys.stdout.buffer, stderr or sys.stderr.buffer,
        )
        return self.wait()

    def close(self) -> None:
        """Stop qemu (it normally powers off by itself once the job ends)."""
        if self._qemu is not None and self._qemu.poll() is None:
            try:
                self._qemu.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._qemu.kill()
                self._qemu.wait()
        _running.discard(self)

    def __enter__(self) -> Guest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the host sees -------------------------------------------------------------

    @property
    def shares(self) -> tuple[Share, ...]:
        """The control share followed by the configured extra shares."""
        return (Share("ctl", self.ctl_dir, writable=True), *self.config.shares)

    def console_tail(self, lines: int = 40) -> str:
        """The last lines of the guest console and of qemu's own messages."""
        parts = []
        for name in ("qemu.log", "console.log"):
            path = self.ctl_dir / name
            text = path.read_text(errors="replace") if path.exists() else ""
            if text.strip():
                parts.append(f"--- {name} ({path}) ---\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(parts) or "(the guest printed nothing)"

    def error(self, message: str) -> GuestError:
        return GuestError(f"{message}\n{self.console_tail()}")

    # -- internals ---------------------------------------------------------------------

    def _write_job(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> None:
        assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        command = " ".join(shlex.quote(a) for a in argv)
        (self.ctl_dir / "job.sh").write_text(
            f"cd {shlex.quote(str(cwd))} || exit 125\nexec env -i {assignments} {command}\n"
        )

    def _pump(self) -> None:
        for tail in self._tails:
            tail.pump()


def clock_cmdline(kernel: Kernel) -> list[str]:
    """Preset the TSC frequency and the delay loop instead of letting the guest calibrate.

    Under TCG the guest's TSC is the host's. Calibrating it against the emulated PIT fails
    now and then when the host is busy; the kernel then marks the TSC unstable and hangs
    early in boot, calibrating the APIC timer on a tick that never comes.
    """
    tsc_khz = host_tsc_khz()
    return [f"tsc_early_khz={tsc_khz}", f"lpj={tsc_khz * 1000 // kernel_hz(kernel)}"]


def host_tsc_khz() -> int:
    """The host's TSC frequency: with a TSC delay loop, BogoMIPS is twice the TSC MHz."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "bogomips":
            return round(float(value) * 500)
    raise GuestError("no bogomips in /proc/cpuinfo: cannot preset the guest's TSC frequency")


def kernel_hz(kernel: Kernel) -> int:
    for line in kernel.config.read_text().splitlines():
        if line.startswith("CONFIG_HZ="):
            return int(line.partition("=")[2])
    return 250  # Debian's amd64 default


def kernel_cmdline(config: GuestConfig, shares: Sequence[Share], ctl_dir: Path) -> str:
    assert config.kernel is not None
    args = [
        *BASE_CMDLINE,
        *clock_cmdline(config.kernel),
        f"dqoes.init={config.init_mode.init}",
        f"dqoes.msize={MSIZE}",
        f"dqoes.ctl={ctl_dir}",
        *(share.cmdline() for share in shares),
        *config.init_mode.cmdline,
        *config.cmdline_extra,
    ]
    for arg in args:
        if any(c.isspace() for c in arg):
            raise GuestError(f"kernel argument with whitespace: {arg!r}")
    return " ".join(args)


def qemu_command(
    config: GuestConfig, vmlinux: Path, initrd: Path, console_log: Path, shares: Sequence[Share]
) -> list[str]:
    root = Share("hostroot", Path("/"))
    ctl_dir = shares[0].host_path
    return [
        QEMU,
        "-M", "microvm,acpi=on",
        "-accel", "tcg,thread=multi",
        "-cpu", "max,la57=off",
        "-smp", str(config.cpus),
        "-m", f"{config.memory_mib}M",
        "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
        "-kernel", str(vmlinux),
        "-initrd", str(initrd),
        "-append", kernel_cmdline(config, shares, ctl_dir),
        "-serial", f"file:{console_log}",
        *root.qemu_args(),
        *(arg for share in shares for arg in share.qemu_args()),
    ]


def _die_with_parent() -> None:
    """In the qemu child: ask the kernel for SIGKILL when our parent dies."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
