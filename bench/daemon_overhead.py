"""The daemon's own cost in steady operation: dqoesd runs as a subprocess managing N
cgroups, ticking every second, while this process feeds every ring PRODUCER_HZ records a
second (the producers' CPU is theirs, not the daemon's). Measured from /proc after the
daemon said READY=1 (its start-up is not counted): CPU time (utime + stime) over the
window, resident memory (VmRSS, its private part RssAnon, the pages of the rings it mapped
and read, RssShmem, which are the producers' shared memory, and the peak VmHWM), and ticks
(one STATUS notification each).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.cgroups import Cgroups, tmpfs_dir
from bench.tick import RING_CAPACITY, Producers, write_state

PRODUCER_HZ = 10
SAMPLE_INTERVAL_S = 1.0
READY_TIMEOUT_S = 300.0  # an emulated CPU imports numpy slowly


@dataclass
class DaemonOverhead:
    where: str
    n: int
    seconds: float
    ticks: int
    cpu_seconds: float
    cpu_percent: float  # of one core
    rss_mb: float
    rss_anon_mb: float
    hwm_mb: float
    sample_interval_s: float = SAMPLE_INTERVAL_S
    rss_shmem_mb: float = 0.0


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS, RssAnon, RssShmem and VmHWM of a process, in MB (10^6 bytes)."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssShmem", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024 / 1e6
    return found


def _notifications(sock: socket.socket) -> list[str]:
    """Every datagram waiting on the notify socket."""
    messages = []
    while True:
        try:
            messages.append(sock.recv(4096).decode(errors="replace"))
        except BlockingIOError:
            return messages


def run(cgroups: Cgroups, n: int, seconds: float) -> DaemonOverhead:
    work = Path(tempfile.mkdtemp(prefix="dqoes-bench-daemon-", dir=tmpfs_dir()))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
    daemon: subprocess.Popen[bytes] | None = None
    producers: Producers | None = None
    try:
        sock.bind(str(work / "notify"))
        names = write_state(work / "state", cgroups.dirs[:n])
        with (work / "dqoesd.log").open("wb") as log:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "dqoes_cg.daemon", "--sample-interval",
                 str(SAMPLE_INTERVAL_S), "--state-dir", str(work / "state"),
                 "--run-dir", str(work / "run"), "--cgroup-mount", str(cgroups.mount),
                 "--ring-capacity", str(RING_CAPACITY)],
                stdout=log, stderr=log,
                env={**os.environ, "NOTIFY_SOCKET": str(work / "notify")})
        _wait_ready(daemon, sock, work / "dqoesd.log")
        producers = Producers(work / "run", names)
        start_cpu, start = cpu_seconds(daemon.pid), time.monotonic()
        ticks = 0
        while (now := time.monotonic()) < start + seconds:
            producers.record()
            ticks += sum(m.startswith("WATCHDOG=1") for m in _notifications(sock))
            time.sleep(min(1 / PRODUCER_HZ, start + seconds - now))
        used, elapsed = cpu_seconds(daemon.pid) - start_cpu, time.monotonic() - start
        ticks += sum(m.startswith("WATCHDOG=1") for m in _notifications(sock))
        memory = memory_mb(daemon.pid)
        return DaemonOverhead(cgroups.where, n, elapsed, ticks, used, 100 * used / elapsed,
                              memory["VmRSS"], memory["RssAnon"], memory["VmHWM"],
                              rss_shmem_mb=memory["RssShmem"])
    finally:
        if producers is not None:
            producers.close()
        if daemon is not None:
            daemon.terminate()
            try:
                daemon.wait(timeout=60)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        sock.close()
        shutil.rmtree(work, ignore_errors=True)


def _wait_ready(daemon: subprocess.Popen[bytes], sock: socket.socket, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not any(m.startswith("READY=1") for m in _notifications(sock)):
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"dqoesd did not become ready:\n{log.read_text()[-2000:]}")
        time.sleep(0.05)
