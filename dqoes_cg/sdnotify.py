"""systemd's notify protocol: one datagram to $NOTIFY_SOCKET (READY=1, STATUS=..., WATCHDOG=1).

No dependency: the protocol is a single sendto() on an AF_UNIX datagram socket. Without
$NOTIFY_SOCKET (not started by systemd) every call is a no-op.
"""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")
        # A leading '@' names an abstract socket (first byte NUL on the wire).
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self._sock: socket.socket | None = None
        if self._address:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def watchdog_interval(self) -> float | None:
        """Seconds between the pings systemd expects (half of WatchdogSec), or None."""
        usec = os.environ.get("WATCHDOG_USEC", "")
        pid = os.environ.get("WATCHDOG_PID", "")
        if not usec.isdigit() or (pid and pid != str(os.getpid())):
            return None
        return int(usec) / 2e6

    def send(self, *fields: str) -> None:
        if self._sock is None:
            return
        try:
            self._sock.sendto("\n".join(fields).encode(), self._address)
        except OSError:
            pass  # systemd gone or socket full: never fatal for the daemon

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def alive(self, status: str) -> None:
        """The watchdog's ping, with the current status: one datagram a tick."""
        self.send("WATCHDOG=1", f"STATUS={status}")

    def stopping(self) -> None:
        self.send("STOPPING=1")
