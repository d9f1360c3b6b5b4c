"""Boot a throwaway qemu guest that sees the host's filesystem and runs one job in it.

The guest is qemu's microvm machine under TCG, booting the host's Debian kernel through PVH
with the host's / as a read-only 9p share under a tmpfs overlay (see README.md). Every guest
has a writable control share: a host temporary directory mounted at the same path inside,
holding the job (job.sh), its output (stdout, stderr) and its exit status (exit_code).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shlex
import shutil
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

from .initramfs import GUEST_DIR, initramfs_path
from .kernel import Kernel, find_kernel, vmlinux_path

QEMU = "qemu-system-x86_64"
MSIZE = 512000  # 9p message size: large reads and writes in few round trips
POLL_INTERVAL = 0.05
MONITOR_SOCKET = "monitor.sock"
# What the monitor tells of a stopped guest: whether each vCPU halted and where, and its
# local APIC (a timer armed or not, an interrupt pending or not).
MONITOR_QUESTIONS = ("info cpus", "info registers -a", "cpu 0", "info lapic", "cpu 1",
                     "info lapic", "info irq")
DEFAULT_MEMORY_MIB = 2048
COMMAND_LINE_SIZE = 2048  # x86
# Mounted afresh in the guest, hiding the host's: a job directory below them is shared.
GUEST_PRIVATE_DIRS = (Path("/tmp"), Path("/run"), Path("/dev"))


class GuestError(RuntimeError):
    """The guest failed to boot or died. The message ends with the console log's tail."""


class GuestTimeout(GuestError):
    """The guest did not boot, or its job did not finish, in time."""


class GuestBootTimeout(GuestTimeout):
    """The guest did not start its job within GuestConfig.boot_timeout."""


class GuestStopped(GuestError):
    """The guest as a whole stopped running its job: no heartbeat for a while."""


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

    def __post_init__(self) -> None:
        # Both qemu's option syntax and the kernel command line would split these.
        for text in (self.tag, str(self.host_path), str(self.guest_path or "")):
            if any(c.isspace() or c in ",:" for c in text):
                raise ValueError(f"9p share {text!r}: no whitespace, ',' or ':' allowed")

    @property
    def mount_point(self) -> Path:
        return self.guest_path or self.host_path

    def cmdline(self) -> str:
        mode, cache = ("rw", "none") if self.writable else ("ro", "loose")
        return f"dqoes.share={self.tag}:{self.mount_point}:{mode}:{cache}"

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

# Debian's default security modules less AppArmor, whose profile for containers dockerd fails
# to load here: for the guests that run Docker's engine.
NO_APPARMOR = "lsm=landlock,lockdown,yama,integrity,bpf"


@dataclass
class GuestConfig:
    """How to boot: everything a later init mode may need to vary is a field."""

    init_mode: InitMode = BUSYBOX_INIT
    cpus: int = 2
    memory_mib: int = DEFAULT_MEMORY_MIB
    cmdline_extra: tuple[str, ...] = ()
    shares: tuple[Share, ...] = ()
    boot_timeout: float = 60.0
    # Seconds without a new heartbeat (guest-lib.sh writes one every 30 s) after which a
    # running guest counts as stopped as a whole: a busy host delays one by a minute at most.
    stopped_after: float = 600.0
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
    """One guest running one job. Use it as a context manager or call close(): qemu never
    outlives it, nor this process (the kernel sends qemu SIGKILL if we die).

    >>> with Guest() as guest:
    ...     status = guest.run(["cat", "/sys/fs/cgroup/cgroup.subtree_control"])

    run() streams the job's output to ours; start() + poll() let the caller do other work
    while the guest runs (the pytest routing reads results as they come).
    """

    def __init__(self, config: GuestConfig | None = None) -> None:
        self.config = config or GuestConfig()
        if self.config.kernel is None:
            raise GuestError("no kernel to boot: install linux-image-amd64")
        self.ctl_dir = Path(tempfile.mkdtemp(prefix="dqoes-guest-"))
        self.boot_seconds: float | None = None  # launch to job start, once known
        self._qemu: subprocess.Popen[bytes] | None = None
        self._outputs: list[tuple[FileTail, BinaryIO]] = []
        self._launched = 0.0
        self._run_timeout: float | None = None
        self._keep_ctl_dir = False
        self._workdir_share: tuple[Share, ...] = ()

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
        """Boot the guest to run `argv` in `cwd` (default: ours) with `env` (default: ours)
        plus DQOES_GUEST=1. poll() copies the job's output to `stdout`/`stderr` if given."""
        kernel = self.config.kernel
        assert kernel is not None and self._qemu is None
        env = {**(os.environ if env is None else env), "DQOES_GUEST": "1"}
        workdir = Path(cwd or os.getcwd()).resolve()
        if any(workdir.is_relative_to(private) for private in GUEST_PRIVATE_DIRS):
            self._workdir_share = (Share("workdir", workdir),)
        self._write_job(argv, workdir, env)
        self._outputs = [
            (FileTail(self.ctl_dir / name), sink)
            for name, sink in (("stdout", stdout), ("stderr", stderr))
            if sink is not None
        ]
        self._run_timeout = run_timeout
        command = qemu_command(
            self.config, vmlinux_path(kernel), initramfs_path(kernel), self.ctl_dir, self.shares
        )
        with (self.ctl_dir / "qemu.log").open("wb") as qemu_log:
            self._qemu = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=qemu_log, stderr=qemu_log,
                preexec_fn=_die_with_parent,
            )
        self._launched = time.monotonic()
        _running.add(self)

    def poll(self) -> int | None:
        """Copy new output; the job's exit status once it has one, else None.
        Raises GuestError if the guest died first, GuestTimeout if a timeout passed,
        GuestStopped if the guest stopped running."""
        assert self._qemu is not None, "start() first"
        exit_code = self.ctl_dir / "exit_code"
        finished = exit_code.exists()
        self._copy_output()  # after the check: the job wrote all its output before
        if finished:
            return int(exit_code.read_text())
        elapsed = time.monotonic() - self._launched
        if self.boot_seconds is None and (self.ctl_dir / "started").exists():
            self.boot_seconds = elapsed
        if self._qemu.poll() is not None:
            self._copy_output()
            phase = "booting" if self.boot_seconds is None else "running the command"
            raise self._error(GuestError, f"guest exited (qemu status "
                                          f"{self._qemu.returncode}) while {phase}")
        if self.boot_seconds is None and elapsed > self.config.boot_timeout:
            raise self._error(GuestBootTimeout,
                              f"guest did not boot within {self.config.boot_timeout:.0f} s "
                              f"(the vCPUs' state: {self._vcpus_state('boot.txt')})")
        if self.boot_seconds is not None and self._run_timeout is not None \
                and elapsed - self.boot_seconds > self._run_timeout:
            raise self._error(GuestTimeout,
                              f"command did not finish within {self._run_timeout:.0f} s")
        silent = self._heartbeat_age()
        if self.boot_seconds is not None and silent > self.config.stopped_after:
            state = self._vcpus_state("stopped.txt")
            raise self._error(GuestStopped, f"the guest stopped: no heartbeat for {silent:.0f} s"
                                            f" (the vCPUs' state: {state})")
        return None

    def _vcpus_state(self, name: str) -> Path:
        """qemu's threads and its vCPUs' registers, written to `name` in the control
        directory (which is then kept); its path."""
        assert self._qemu is not None
        path = self.ctl_dir / name
        path.write_text(f"{qemu_threads(self._qemu.pid)}\n"
                        f"{ask_monitor(self.ctl_dir / MONITOR_SOCKET)}")
        return path

    def _heartbeat_age(self) -> float:
        """Seconds since the guest last wrote its heartbeat (or started the job)."""
        for name in ("heartbeat", "started"):
            with contextlib.suppress(FileNotFoundError):
                return time.time() - (self.ctl_dir / name).stat().st_mtime
        return 0.0

    def wait(self) -> int:
        """Block until the job ends; its exit status."""
        while (status := self.poll()) is None:
            time.sleep(POLL_INTERVAL)
        return status

    def run(
        self,
        argv: Sequence[str],
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        run_timeout: float | None = None,
    ) -> int:
        """Run `argv` in the guest with its output streamed to ours; its exit status."""
        self.start(argv, cwd, env, run_timeout, sys.stdout.buffer, sys.stderr.buffer)
        return self.wait()

    def close(self) -> None:
        """Stop qemu: give a finished guest a moment to power off, kill anything else.
        The control directory goes too, unless an error message points into it."""
        if self._qemu is not None and self._qemu.poll() is None:
            if (self.ctl_dir / "exit_code").exists():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._qemu.wait(timeout=5)
            self._qemu.kill()
            self._qemu.wait()
        _running.discard(self)
        if not self._keep_ctl_dir:
            shutil.rmtree(self.ctl_dir, ignore_errors=True)

    def __enter__(self) -> Guest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what the host sees -------------------------------------------------------------

    @property
    def shares(self) -> tuple[Share, ...]:
        """The control share, the configured extra shares, and the job's directory if the
        guest's own mounts would hide it; parents before children, which the guest mounts in
        this order (a writable share inside the job's directory stays visible)."""
        return mount_order((Share("ctl", self.ctl_dir, writable=True), *self.config.shares,
                            *self._workdir_share))

    def console_tail(self, lines: int = 40) -> str:
        """The last lines of the guest console and of qemu's own messages."""
        parts = []
        for name in ("qemu.log", "console.log"):
            path = self.ctl_dir / name
            text = path.read_text(errors="replace") if path.exists() else ""
            if text.strip():
                tail = "\n".join(text.splitlines()[-lines:])
                parts.append(f"--- {name} ({path}) ---\n{tail}")
        return "\n".join(parts) or "(the guest printed nothing)"

    # -- internals ---------------------------------------------------------------------

    def _error(self, kind: type[GuestError], message: str) -> GuestError:
        self._keep_ctl_dir = True
        heartbeat = self.ctl_dir / "heartbeat"
        last = ""
        with contextlib.suppress(FileNotFoundError):
            last = (f"\n--- heartbeat, {self._heartbeat_age():.0f} s old (uptime, load, "
                    f"processes) ---\n{heartbeat.read_text(errors='replace')}")
        return kind(f"{message}\n{self.console_tail()}{last}")

    def _write_job(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> None:
        assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        command = " ".join(shlex.quote(a) for a in argv)
        (self.ctl_dir / "job.sh").write_text(
            f"cd {shlex.quote(str(cwd))} || exit 125\nexec env -i {assignments} {command}\n"
        )

    def _copy_output(self) -> None:
        for tail, sink in self._outputs:
            data = tail.read()
            if data:
                sink.write(data)
                sink.flush()


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


def mount_order(shares: Sequence[Share]) -> tuple[Share, ...]:
    """`shares` in the order the guest mounts them: a parent before what lies inside it."""
    return tuple(sorted(shares, key=lambda s: len(s.mount_point.parts)))


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
        *os.environ.get("DQOES_GUEST_APPEND", "").split(),
    ]
    for arg in args:
        if any(c.isspace() for c in arg):
            raise GuestError(f"kernel argument with whitespace: {arg!r}")
    cmdline = " ".join(args)
    if len(cmdline) >= COMMAND_LINE_SIZE:  # the kernel would cut it silently
        raise GuestError(f"kernel command line longer than {COMMAND_LINE_SIZE - 1} bytes")
    return cmdline


def qemu_command(
    config: GuestConfig, vmlinux: Path, initrd: Path, ctl_dir: Path, shares: Sequence[Share]
) -> list[str]:
    root = Share("hostroot", Path("/"))
    return [
        QEMU,
        # ACPI tells the kernel where the virtio-mmio devices are, and powers off.
        "-M", "microvm,acpi=on",
        "-accel", "tcg,thread=multi",
        # 4-level paging: one page-table level less for TCG to walk on every TLB miss.
        "-cpu", "max,la57=off",
        "-smp", str(config.cpus),
        "-m", f"{config.memory_mib}M",
        "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
        "-kernel", str(vmlinux),
        "-initrd", str(initrd),
        "-append", kernel_cmdline(config, shares, ctl_dir),
        "-serial", f"file:{ctl_dir / 'console.log'}",
        # The human monitor, for what the emulated CPUs were doing if the guest stops.
        "-monitor", f"unix:{ctl_dir / MONITOR_SOCKET},server=on,wait=off",
        *root.qemu_args(),
        *(arg for share in shares for arg in share.qemu_args()),
    ]


def ask_monitor(socket_path: Path, questions: Sequence[str] = MONITOR_QUESTIONS,
                timeout: float = 10.0) -> str:
    """qemu's answers to `questions` on its human monitor, or as much as it gave and why not
    more."""
    import socket

    transcript = bytearray()

    def read_to_prompt(monitor: socket.socket) -> None:
        while not transcript.endswith(b"(qemu) "):
            chunk = monitor.recv(65536)
            if not chunk:
                raise ConnectionError("the monitor hung up")
            transcript.extend(chunk)

    try:
        with socket.socket(socket.AF_UNIX) as monitor:
            monitor.settimeout(timeout)
            monitor.connect(str(socket_path))
            read_to_prompt(monitor)
            for question in questions:
                monitor.sendall(question.encode() + b"\n")
                transcript.extend(b"\n")
                read_to_prompt(monitor)
    except OSError as error:
        transcript.extend(f"\n(the monitor did not answer: {error})".encode())
    # Drop the monitor's echo of each question, typed out with terminal escapes.
    return "\n".join(line for line in transcript.decode(errors="replace").splitlines()
                     if "\x1b" not in line)


def qemu_threads(pid: int) -> str:
    """Each thread of qemu: its name, state, kernel wait channel and CPU time so far."""
    lines = ["qemu's threads (tid, name, state, wait channel, user+system ticks):"]
    for task in sorted(Path(f"/proc/{pid}/task").glob("*"), key=lambda t: int(t.name)):
        with contextlib.suppress(OSError):
            stat = (task / "stat").read_text()
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            ticks = int(fields[11]) + int(fields[12])
            lines.append(f"{task.name} {name} {fields[0]} {(task / 'wchan').read_text()} {ticks}")
    return "\n".join(lines)


def _die_with_parent() -> None:
    """In the qemu child: ask the kernel for SIGKILL when our parent dies."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
