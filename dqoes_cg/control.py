"""The control protocol between dqoesctl and dqoesd: versioned JSON lines on a Unix socket.

A request is one JSON object on one line, ``{"version": 1, "op": OP, ...arguments}``; the
reply is one line, ``{"version": 1, "ok": true, "result": ...}`` or
``{"version": 1, "ok": false, "error": "one-line message"}``, and the daemon closes the
connection. Operations (arguments):

    set-target    container, target_s, metric, pending   (write)
    unset-target  container                              (write)
    list                                                 (read)
    status        container (optional)                   (read)

Write operations need root or membership of the configured group; read operations need the
same unless the daemon was started with --public-status. The peer is identified by
SO_PEERCRED, never by what it claims. The server is non-blocking and driven by the daemon's
loop (``poll``), so a slow or hostile client can delay nothing but itself.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import selectors
import socket
import stat
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
WRITE_OPS = frozenset({"set-target", "unset-target"})
READ_OPS = frozenset({"list", "status"})
MAX_REQUEST = 64 * 1024
CLIENT_DEADLINE_S = 2.0
MAX_CLIENTS = 32


class RequestError(Exception):
    """A request the daemon refuses; the message goes back to the client as is."""


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int


Handler = Callable[[str, dict[str, Any], Peer], Any]


def peer_of(conn: socket.socket) -> Peer:
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                        struct.calcsize("3i")))
    return Peer(pid, uid, gid)


def peer_in_group(peer: Peer, gid: int) -> bool:
    if peer.gid == gid:
        return True
    try:  # supplementary groups of the peer process, as the kernel has them
        for line in Path(f"/proc/{peer.pid}/status").read_text().splitlines():
            if line.startswith("Groups:"):
                return str(gid) in line.split()[1:]
    except OSError:
        pass
    return False


class ControlServer:
    def __init__(self, path: Path, handler: Handler, group: str | None = None,
                 public_read: bool = False) -> None:
        self.path = path
        self._handler = handler
        self._gid = grp.getgrnam(group).gr_gid if group else None
        self._public_read = public_read
        self._selector = selectors.DefaultSelector()
        self._clients: dict[socket.socket, tuple[bytearray, float]] = {}
        self._listener = self._listen()
        self._selector.register(self._listener, selectors.EVENT_READ)

    def _listen(self) -> socket.socket:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        try:  # a stale socket from a previous run; anything else at the path is an error
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                self.path.unlink()
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.bind(str(self.path))
        # Who may connect is decided per request (SO_PEERCRED); the mode only keeps out
        # those who could never be allowed anything.
        mode = 0o666 if self._public_read else 0o660
        if self._gid is not None:
            os.chown(self.path, 0, self._gid)
        elif not self._public_read:
            mode = 0o600
        os.chmod(self.path, mode)
        sock.listen(16)
        sock.setblocking(False)
        return sock

    def close(self) -> None:
        for conn in list(self._clients):
            self._drop(conn)
        self._selector.close()
        self._listener.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def poll(self, timeout: float) -> None:
        """Serve requests until `timeout` seconds have passed."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for key, _ in self._selector.select(remaining):
                if key.fileobj is self._listener:
                    self._accept()
                else:
                    self._read(key.fileobj)  # type: ignore[arg-type]
            self._expire()

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        if len(self._clients) >= MAX_CLIENTS:
            conn.close()
            return
        conn.setblocking(False)
        self._clients[conn] = (bytearray(), time.monotonic() + CLIENT_DEADLINE_S)
        self._selector.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> None:
        buf, _ = self._clients[conn]
        try:
            chunk = conn.recv(MAX_REQUEST)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        buf += chunk
        if b"\n" in buf:
            self._answer(conn, bytes(buf.split(b"\n", 1)[0]))
        elif not chunk:
            self._drop(conn)
        elif len(buf) > MAX_REQUEST:
            self._answer(conn, None)

    def _answer(self, conn: socket.socket, line: bytes | None) -> None:
        reply = self._reply(conn, line)
        try:
            conn.setblocking(True)
            conn.settimeout(CLIENT_DEADLINE_S)
            conn.sendall(json.dumps(reply).encode() + b"\n")
        except OSError:
            pass
        self._drop(conn)

    def _reply(self, conn: socket.socket, line: bytes | None) -> dict[str, Any]:
        try:
            if line is None:
                raise RequestError(f"request larger than {MAX_REQUEST} bytes")
            try:
                req = json.loads(line)
            except (ValueError, UnicodeDecodeError) as e:
                raise RequestError("request is not valid JSON") from e
            if not isinstance(req, dict):
                raise RequestError("request must be a JSON object")
            if req.get("version") != PROTOCOL_VERSION:
                raise RequestError(f"protocol version {req.get('version')!r} not supported "
                                   f"(daemon speaks {PROTOCOL_VERSION})")
            op = req.get("op")
            if op not in WRITE_OPS | READ_OPS:
                raise RequestError(f"unknown operation {op!r}")
            peer = peer_of(conn)
            self._authorize(op, peer)
            result = self._handler(op, req, peer)
            return {"version": PROTOCOL_VERSION, "ok": True, "result": result}
        except RequestError as e:
            return {"version": PROTOCOL_VERSION, "ok": False, "error": str(e)}
        except Exception:  # a bug must not take the daemon down with it
            log.exception("control request failed")
            return {"version": PROTOCOL_VERSION, "ok": False, "error": "internal error (see log)"}

    def _authorize(self, op: str, peer: Peer) -> None:
        if peer.uid == 0 or (op in READ_OPS and self._public_read):
            return
        if self._gid is not None and peer_in_group(peer, self._gid):
            return
        raise RequestError(f"permission denied: {op} needs root"
                           + (" or the daemon's control group" if self._gid is not None else ""))

    def _expire(self) -> None:
        now = time.monotonic()
        for conn, (_, deadline) in list(self._clients.items()):
            if now > deadline:
                self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        self._clients.pop(conn, None)
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()


class DaemonUnavailable(Exception):
    pass


def request(path: Path, op: str, timeout: float = 10.0, **args: Any) -> Any:
    """Send one request; return its result or raise RequestError / DaemonUnavailable."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(str(path))
        except FileNotFoundError as e:
            raise DaemonUnavailable(f"daemon not running (no socket at {path})") from e
        except ConnectionRefusedError as e:
            raise DaemonUnavailable(f"daemon not running (nothing listens on {path})") from e
        except PermissionError as e:
            raise RequestError(f"permission denied: cannot connect to {path}") from e
        sock.sendall(json.dumps({"version": PROTOCOL_VERSION, "op": op, **args}).encode()
                     + b"\n")
        data = bytearray()
        while not data.endswith(b"\n"):
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            data += chunk
    except TimeoutError as e:
        raise DaemonUnavailable(f"daemon did not answer within {timeout:.0f} s") from e
    finally:
        sock.close()
    try:
        reply = json.loads(data)
    except ValueError as e:
        raise DaemonUnavailable("daemon closed the connection without a valid reply") from e
    if not reply.get("ok"):
        raise RequestError(reply.get("error", "request failed"))
    return reply.get("result")
