"""A dqoesd process for the control-plane benchmarks (scale.py, soak.py): started over a
cgroup tree with its state and run directories in a work directory and its log in a file.
A thread records its notifications (READY=1, then once a tick WATCHDOG=1 and its status
line) with the time each arrived, so that the gaps between ticks can be read afterwards;
it also keeps the notify socket drained (a full one would block the daemon).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from bench.daemon_overhead import READY_TIMEOUT_S, cpu_seconds, memory_mb
from dqoes_cg.control import request

DQOESD = (sys.executable, "-m", "dqoes_cg.daemon")
STOP_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 120.0  # a status of 10,000 containers on an emulated CPU


def interrupt_on_sigterm() -> None:
    """SIGTERM ends a benchmark as an interrupt does: its daemon stopped, its cgroups and
    files removed on the way out."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


class Dqoesd:
    """dqoesd over the cgroup tree at `mount`, with `args` added to its command line;
    `command` runs it (a wrapper that calls dqoes_cg.daemon.main with the arguments)."""

    def __init__(self, work: Path, mount: Path, *args: str,
                 command: Sequence[str] = DQOESD) -> None:
        self.work = work
        self.socket = work / "run" / "dqoes.sock"
        self.log = work / "dqoesd.log"
        self._ticks: list[float] = []
        self.status_line = ""  # the last tick's: "N bound, P pending; ..."
        self._ready = threading.Event()
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind(str(work / "notify"))
        self._notify.settimeout(0.2)
        self._closing = False
        self._reader = threading.Thread(target=self._read_notifications, daemon=True)
        self._reader.start()
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [*command, "--state-dir", str(work / "state"),
                 "--run-dir", str(work / "run"), "--cgroup-mount", str(mount),
                 "--engine-socket", str(work / "docker.sock"),
                 "--podman-socket", str(work / "podman.sock"), *args],
                stdout=log, stderr=log,
                env={**os.environ, "NOTIFY_SOCKET": str(work / "notify")})
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"dqoesd did not become ready:\n{self.log_tail()}")

    def _read_notifications(self) -> None:
        while not self._closing:
            try:
                message = self._notify.recv(4096).decode(errors="replace")
            except TimeoutError:
                continue
            except OSError:
                return
            if message.startswith("WATCHDOG=1"):
                self._ticks.append(time.monotonic())
                self.status_line = message.partition("STATUS=")[2]
            elif message.startswith("READY=1"):
                self._ready.set()

    def request(self, op: str, **args: Any) -> Any:
        return request(self.socket, op, timeout=REQUEST_TIMEOUT_S, **args)

    def ticks_between(self, start: float, end: float) -> list[float]:
        """When each tick between two monotonic times was notified."""
        return [t for t in list(self._ticks) if start <= t <= end]

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def memory_mb(self) -> dict[str, float]:
        """VmRSS, RssAnon and VmHWM in MB."""
        return memory_mb(self.proc.pid)

    def log_tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def close(self) -> None:
        """Stops the daemon (SIGTERM: it gives every limit back), then the reader."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._closing = True
        self._reader.join()
        with contextlib.suppress(OSError):
            self._notify.close()

    def __enter__(self) -> Dqoesd:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
