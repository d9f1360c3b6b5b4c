"""The control protocol between dqoesctl and dqoesd: versioned JSON lines on a Unix socket.

A request is one JSON object on one line, ``{"version": 1, "op": OP, ...arguments}``; the
reply is one line, ``{"version": 1, "ok": true, "result": ...}`` or
``{"version": 1, "ok": false, "error": "one-line message"}``, and the daemon closes the
connection (the framing is jsonline.py's, the cluster's channel's too). The operations and
their arguments are the daemon's (api.py); `status` and `list` may be asked for a page at
a time (paging.py).

Write operations need root or membership of the configured group; read operations need the
same unless the daemon was started with --public-status. The peer is identified by
SO_PEERCRED, never by what it claims.

The server is non-blocking and driven by the daemon's loop (`poll`), so a slow or hostile
client delays nothing but itself: replies are buffered and sent as the client reads them;
a reply whose making grows with the containers (a status of thousands of them) is made
away from the loop, in the server's thread for replies, from what the handler took in the
loop (`Later`), one at a time, and sent by the loop once made; every connection has a
deadline (CLIENT_DEADLINE_S to send its request, then as long between the reply being
ready and each part of it being read: the time the daemon takes to make a reply is not the
client's), and a user other than root may hold at most
MAX_CLIENTS_PER_UID connections and MAX_BUFFERED bytes of unsent replies; root is always
served (up to MAX_ROOT_CLIENTS).
"""

from __future__ import annotations

import grp
import logging
import math
import os
import queue
import selectors
import socket
import stat
import struct
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from .jsonline import Encoded, decode, encode, encode_in_parts, take_line

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
MAX_REQUEST = 64 * 1024
CLIENT_DEADLINE_S = 2.0
MAX_CLIENTS_PER_UID = 4
MAX_OTHER_CLIENTS = 32  # connections of users other than root, all together
MAX_ROOT_CLIENTS = 256
MAX_BUFFERED = 32 << 20  # bytes of unsent replies to users other than root, all together
BACKLOG = 128


class RequestError(Exception):
    """A request the daemon refuses; the message goes back to the client as is."""


@dataclass(frozen=True)
class Later:
    """A handler's result made away from the loop: `make()` runs in the server's thread for
    replies (what it needs of the loop's state, the handler took)."""

    make: Callable[[], Any]


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


@dataclass(eq=False)
class _Client:
    peer: Peer
    deadline: float
    request: bytearray = field(default_factory=bytearray)
    reply: memoryview | None = None


class ControlServer:
    """Serves the operations `ops` (name -> whether it writes) with `handler`."""

    def __init__(self, path: Path, handler: Handler, ops: Mapping[str, bool],
                 group: str | None = None, public_read: bool = False) -> None:
        self.path = path
        self._handler = handler
        self._ops = dict(ops)
        self._gid = grp.getgrnam(group).gr_gid if group else None
        self._public_read = public_read
        self._selector = selectors.DefaultSelector()
        self._clients: dict[socket.socket, _Client] = {}
        self._buffered = 0  # unsent reply bytes of users other than root
        self._listener = self._listen()
        self._selector.register(self._listener, selectors.EVENT_READ)
        # Replies made away from the loop: one at a time (each client has one request),
        # handed back through `_made`, with a byte on `_wake` to end the loop's wait.
        self._maker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="control-replies")
        self._made: queue.SimpleQueue[tuple[socket.socket, bytes]] = queue.SimpleQueue()
        self._woken, self._wake = socket.socketpair()
        for s in (self._woken, self._wake):
            s.setblocking(False)
        self._selector.register(self._woken, selectors.EVENT_READ)

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
        sock.listen(BACKLOG)
        sock.setblocking(False)
        return sock

    def close(self) -> None:
        self._maker.shutdown(wait=True, cancel_futures=True)
        for conn in list(self._clients):
            self._drop(conn)
        self._selector.close()
        self._listener.close()
        self._woken.close()
        self._wake.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def poll(self, timeout: float) -> None:
        """Serve requests for `timeout` seconds; at least one look even when it is 0 or
        less (a tick that overran its interval)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            for key, events in self._selector.select(remaining):
                if key.fileobj is self._listener:
                    self._accept()
                elif key.fileobj is self._woken:
                    self._send_made()
                elif events & selectors.EVENT_WRITE:
                    self._send(key.fileobj)  # type: ignore[arg-type]
                else:
                    self._read(key.fileobj)  # type: ignore[arg-type]
            self._expire()
            if remaining <= 0:
                break

    def _accept(self) -> None:
        while True:  # empty the backlog: clients wait there otherwise
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # e.g. out of descriptors: drop this one, go on later
                log.warning("control socket: accept failed: %s", e.strerror)
                return
            peer = peer_of(conn)
            if not self._room_for(peer):
                conn.close()
                continue
            conn.setblocking(False)
            self._clients[conn] = _Client(peer, time.monotonic() + CLIENT_DEADLINE_S)
            self._selector.register(conn, selectors.EVENT_READ)
            # Its request is usually there already: answered now, not after the next tick
            # (a look after an overrunning tick is a single pass).
            self._read(conn)

    def _room_for(self, peer: Peer) -> bool:
        same = sum(1 for c in self._clients.values() if c.peer.uid == peer.uid)
        if peer.uid == 0:
            return same < MAX_ROOT_CLIENTS
        others = sum(1 for c in self._clients.values() if c.peer.uid != 0)
        return same < MAX_CLIENTS_PER_UID and others < MAX_OTHER_CLIENTS

    def _read(self, conn: socket.socket) -> None:
        client = self._clients[conn]
        try:
            chunk = conn.recv(MAX_REQUEST)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        client.request += chunk
        try:
            line = take_line(client.request, MAX_REQUEST)
        except ValueError:
            self._answer(conn, None)
            return
        if line is not None:
            self._answer(conn, line)
        elif not chunk:
            self._drop(conn)

    def _answer(self, conn: socket.socket, line: bytes | None) -> None:
        client = self._clients[conn]
        reply = self._reply(client.peer, line)
        if isinstance(reply, Later):
            client.deadline = math.inf  # the time the daemon takes is not the client's
            self._selector.unregister(conn)  # nothing more is read from it
            self._maker.submit(self._make, conn, reply)
            return
        self._send_reply(conn, _line(reply))

    def _make(self, conn: socket.socket, later: Later) -> None:
        """In the thread for replies: make one, hand it to the loop and wake it."""
        try:
            data = encode_in_parts(later.make())
        except Exception:  # a bug must not leave the client without an answer
            log.exception("control reply failed")
            data = encode(_error("internal error (see the daemon's log)"))
        self._made.put((conn, data))
        try:
            self._wake.send(b"\0")
        except BlockingIOError:  # full of wake-ups already: the loop will look
            pass

    def _send_made(self) -> None:
        """Send the replies made away from the loop, to the clients still there."""
        try:
            while self._woken.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                conn, data = self._made.get_nowait()
            except queue.Empty:
                return
            if conn in self._clients:
                self._send_reply(conn, data)

    def _send_reply(self, conn: socket.socket, data: bytes) -> None:
        client = self._clients[conn]
        if client.peer.uid != 0:
            if self._buffered + len(data) > MAX_BUFFERED:
                data = encode(_error("daemon busy: too many unread replies; try again"))
            self._buffered += len(data)
        client.reply = memoryview(data)
        client.deadline = time.monotonic() + CLIENT_DEADLINE_S
        if conn in self._selector.get_map():
            self._selector.modify(conn, selectors.EVENT_WRITE)
        else:  # its reply was made away from the loop
            self._selector.register(conn, selectors.EVENT_WRITE)
        self._send(conn)

    def _send(self, conn: socket.socket) -> None:
        client = self._clients[conn]
        assert client.reply is not None
        try:
            sent = conn.send(client.reply)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        if client.peer.uid != 0:
            self._buffered -= sent
        client.reply = client.reply[sent:]
        client.deadline = time.monotonic() + CLIENT_DEADLINE_S
        if not client.reply:
            self._drop(conn)

    def _reply(self, peer: Peer, line: bytes | None) -> dict[str, Any] | Later:
        """The reply to a request, or what makes it away from the loop."""
        return _replied(partial(self._run, peer, line))

    def _run(self, peer: Peer, line: bytes | None) -> Any:
        if line is None:
            raise RequestError(f"request larger than {MAX_REQUEST} bytes")
        try:
            req = decode(line)
        except ValueError as e:
            raise RequestError(f"request {e}") from None
        if req.get("version") != PROTOCOL_VERSION:
            raise RequestError(f"protocol version {req.get('version')!r:.40} not "
                               f"supported (daemon speaks {PROTOCOL_VERSION})")
        op = req.get("op")
        if not isinstance(op, str) or op not in self._ops:
            raise RequestError(f"unknown operation {op!r:.60}")
        self._authorize(op, peer)
        return self._handler(op, req, peer)

    def _authorize(self, op: str, peer: Peer) -> None:
        if peer.uid == 0 or (not self._ops[op] and self._public_read):
            return
        if self._gid is not None and peer_in_group(peer, self._gid):
            return
        raise RequestError(f"permission denied: {op} needs root"
                           + (" or the daemon's control group" if self._gid is not None else ""))

    def _expire(self) -> None:
        now = time.monotonic()
        for conn, client in list(self._clients.items()):
            if now > client.deadline:
                self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        client = self._clients.pop(conn, None)
        if client is not None and client.reply is not None and client.peer.uid != 0:
            self._buffered -= len(client.reply)
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()


def _line(reply: dict[str, Any]) -> bytes:
    """A reply on its line; a result made already (Encoded) goes in as it is."""
    return encode_in_parts(reply) if isinstance(reply.get("result"), Encoded) else encode(reply)


def _replied(run: Callable[[], Any]) -> dict[str, Any] | Later:
    """The reply of what `run` returns (a `Later`: what makes it), or of its error."""
    try:
        result = run()
    except RequestError as e:
        return _error(str(e))
    except Exception:  # a bug must not take the daemon down with it
        log.exception("control request failed")
        return _error("internal error (see the daemon's log)")
    if isinstance(result, Later):
        return Later(partial(_replied, result.make))
    return {"version": PROTOCOL_VERSION, "ok": True, "result": result}


def _error(message: str) -> dict[str, Any]:
    return {"version": PROTOCOL_VERSION, "ok": False, "error": message}


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
        except BlockingIOError as e:  # EAGAIN: the listen backlog is full
            raise DaemonUnavailable(f"daemon busy (the backlog of {path} is full); "
                                    "try again") from e
        sock.sendall(encode({"version": PROTOCOL_VERSION, "op": op, **args}))
        data = bytearray()
        while not data.endswith(b"\n"):
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            data += chunk
    except TimeoutError as e:
        raise DaemonUnavailable(f"daemon did not answer within {timeout:.0f} s") from e
    except OSError as e:
        raise DaemonUnavailable(f"lost the connection to the daemon at {path}: "
                                f"{e.strerror or e}") from e
    finally:
        sock.close()
    try:
        reply = decode(data)
    except ValueError as e:
        raise DaemonUnavailable("daemon closed the connection without a valid reply") from e
    if not reply.get("ok"):
        raise RequestError(reply.get("error", "request failed"))
    return reply.get("result")
