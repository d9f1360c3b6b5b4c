"""The `dqoes` volume driver: a ring per container that only its own container can reach,
made through Docker itself.

    docker run --mount type=volume,volume-driver=dqoes,dst=/run/dqoes ... IMAGE

Docker finds the driver by its spec file (/etc/docker/plugins/dqoes.spec, which `make
install` puts in place, naming the socket RUN_DIR/plugin.sock) and speaks Docker's legacy
plugin protocol to it (Plugin.Activate, VolumeDriver.Create/Remove/Mount/Unmount/Path/Get/
List/Capabilities: JSON over HTTP POST). Each volume is a directory RUN_DIR/volumes/NAME
(the parent is root's alone). When a container mounts it, the daemon mounts a small tmpfs
there (size: twice the ring, so that a ring can be re-created beside a broken one, and 16
inodes), makes the ring in it, and hands Docker the directory, which Docker bind-mounts into
the container. So:
  - a container reaches its own ring and nothing else of the daemon's (a second container
    mounting the same volume is refused);
  - whatever a container writes there (a ring grown with ftruncate, files) fills its own
    tmpfs only, never the space of its neighbours' rings or of /run.
When its container stops, the tmpfs is unmounted (lazily: the daemon may still hold the
ring open for a moment). The watcher (watcher.py) sees which volume a container mounts in
its inspect data, and the container's target reads that ring.

Who mounts: dqoesd runs in a mount namespace of its own (systemd's PrivateMounts=), where
its mounts would be invisible to dockerd. So it asks systemd for a transient mount unit
over D-Bus (`SystemdMounts`), which mounts in the host's namespace, and the mount
propagates into the daemon's. Without systemd, the daemon mounts it itself
(`KernelMounts`).
"""

from __future__ import annotations

import contextlib
import ctypes
import http.server
import io
import json
import logging
import os
import re
import socket
import socketserver
import stat
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jeepney import new_method_call
from jeepney.io.blocking import open_dbus_connection
from jeepney.wrappers import DBusErrorResponse, unwrap_msg

from .._native import lib
from ..logs import RateLimitedLog
from ..ring import RING_FILE, create_ring
from ..systemd_units import CALL_TIMEOUT_S, SYSTEM_BUS, SYSTEMD_MANAGER

log = logging.getLogger(__name__)

DRIVER = "dqoes"
SPEC_FILE = Path("/etc/docker/plugins") / f"{DRIVER}.spec"
SOCKET_NAME = "plugin.sock"
VOLUMES_DIR = "volumes"
MAX_REQUEST = 64 * 1024
REQUEST_TIMEOUT_S = 10.0  # for a whole request to arrive, however it is paced
MAX_CONNECTIONS = 256  # served at once; beyond, a connection is closed unanswered
MOUNT_TIMEOUT_S = 20.0
TMPFS_INODES = 16
SLACK_BYTES = 64 * 1024
_VOLUME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_MOUNT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,255}")  # Docker's: 64 hex digits
OWNER_SUFFIX = ".owner"  # .NAME.owner beside each mounted volume: no volume name starts "."


class VolumeError(Exception):
    """A request the driver refuses; the one-line message goes back to Docker."""


class Mounts:
    """Who mounts and unmounts the volumes' tmpfs, and how the driver sees one mounted."""

    def mount(self, where: Path, size: int) -> None:
        raise NotImplementedError

    def unmount(self, where: Path) -> None:
        raise NotImplementedError

    def mounted(self, where: Path) -> bool:
        return os.path.ismount(where)


def tmpfs_options(size: int) -> str:
    return f"size={size},nr_inodes={TMPFS_INODES},mode=0755"


def unit_name(where: Path) -> str:
    """systemd's name of the mount unit at `where` (systemd-escape --path --suffix=mount)."""
    parts = [p for p in str(where).split("/") if p]
    escaped = []
    for part in parts:
        out = []
        for i, ch in enumerate(part):
            if (ch.isascii() and (ch.isalnum() or ch in ":_.")) and not (i == 0 and ch == "."):
                out.append(ch)
            else:
                out.extend(f"\\x{b:02x}" for b in ch.encode())
        escaped.append("".join(out))
    return "-".join(escaped) + ".mount"


class SystemdMounts(Mounts):
    """tmpfs mounts made by systemd (transient mount units), in the host's namespace."""

    def __init__(self, timeout: float = MOUNT_TIMEOUT_S) -> None:
        self.timeout = timeout

    def mount(self, where: Path, size: int) -> None:
        unit = unit_name(where)
        with self._bus() as bus:
            with contextlib.suppress(DBusErrorResponse):  # a failed try of an earlier run
                self._call(bus, "ResetFailedUnit", "s", (unit,))
            self._call(bus, "StartTransientUnit", "ssa(sv)a(sa(sv))", (
                unit, "fail",
                [("Description", ("s", f"dqoes-cg ring volume {where.name}")),
                 ("What", ("s", "tmpfs")), ("Type", ("s", "tmpfs")),
                 ("Options", ("s", f"{tmpfs_options(size)},nosuid,nodev,noexec")),
                 ("LazyUnmount", ("b", True))], []))
        _wait(lambda: self.mounted(where), self.timeout, f"systemd to mount {where}")

    def unmount(self, where: Path) -> None:
        with self._bus() as bus:
            try:
                self._call(bus, "StopUnit", "ss", (unit_name(where), "replace"))
            except DBusErrorResponse as e:
                if not self.mounted(where):
                    return
                raise VolumeError(f"systemd cannot unmount {where}: {e}") from None
        _wait(lambda: not self.mounted(where), self.timeout,
              f"systemd to unmount {where}")

    @contextlib.contextmanager
    def _bus(self) -> Any:
        try:
            bus = open_dbus_connection(SYSTEM_BUS, auth_timeout=CALL_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as e:
            raise VolumeError(f"cannot reach systemd on the system bus: {e}") from None
        try:
            yield bus
        finally:
            bus.close()

    @staticmethod
    def _call(bus: Any, method: str, signature: str, args: tuple[Any, ...]) -> Any:
        try:
            return unwrap_msg(bus.send_and_get_reply(
                new_method_call(SYSTEMD_MANAGER, method, signature, args),
                timeout=CALL_TIMEOUT_S))
        except (OSError, TimeoutError) as e:
            raise VolumeError(f"systemd did not answer {method}: {e}") from None


class KernelMounts(Mounts):
    """tmpfs mounts made by this process (a daemon outside systemd, in the host's mount
    namespace, with CAP_SYS_ADMIN)."""

    MS_NOSUID, MS_NODEV, MS_NOEXEC, MNT_DETACH = 2, 4, 8, 2

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)

    def mount(self, where: Path, size: int) -> None:
        flags = self.MS_NOSUID | self.MS_NODEV | self.MS_NOEXEC
        if self._libc.mount(b"tmpfs", os.fsencode(where), b"tmpfs", flags,
                            tmpfs_options(size).encode()) != 0:
            raise VolumeError(f"cannot mount a tmpfs at {where}: "
                              f"{os.strerror(ctypes.get_errno())}")

    def unmount(self, where: Path) -> None:
        if self._libc.umount2(os.fsencode(where), self.MNT_DETACH) != 0:
            errno = ctypes.get_errno()
            if self.mounted(where):
                raise VolumeError(f"cannot unmount {where}: {os.strerror(errno)}")


def default_mounts() -> Mounts:
    return SystemdMounts() if Path("/run/systemd/system").is_dir() else KernelMounts()


def _wait(done: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise VolumeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.01)


class VolumeDriver:
    """The driver's operations, one method per endpoint of the protocol (`handle`)."""

    def __init__(self, run_dir: Path, ring_capacity: int, mounts: Mounts) -> None:
        self.directory = Path(run_dir) / VOLUMES_DIR
        self.capacity = ring_capacity
        ring_size = lib.dq_ring_file_size(ring_capacity)
        self.size = -(-(2 * ring_size + SLACK_BYTES) // 4096) * 4096
        self.mounts = mounts
        self._lock = threading.Lock()
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.directory, 0o700)  # nobody but root walks to a ring from the host
        self._owners = self._load_owners()  # volume -> the mount ID that holds it

    def ring(self, name: str) -> Path:
        """Where the ring of volume `name` is while a container has it mounted."""
        return self.directory / name / RING_FILE

    def handle(self, endpoint: str, request: Any) -> dict[str, Any]:
        """The reply to one request: the endpoint's, or {"Err": message}."""
        operation = _ENDPOINTS.get(endpoint)
        if operation is None:
            return {"Err": f"unknown endpoint {endpoint[:80]!r}"}
        if not isinstance(request, dict):
            request = {}
        try:
            with self._lock:
                return {"Err": "", **operation(self, request)}
        except VolumeError as e:
            log.warning("volume driver: %s: %s", endpoint, e)
            return {"Err": str(e)}
        except OSError as e:
            log.warning("volume driver: %s: %s", endpoint, e)
            return {"Err": f"{endpoint}: {e.strerror or e}"}

    # --- the endpoints ------------------------------------------------------------------

    def activate(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"Implements": ["VolumeDriver"]}

    def capabilities(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"Capabilities": {"Scope": "local"}}

    def create(self, request: dict[str, Any]) -> dict[str, Any]:
        name = self._name(request)
        if request.get("Opts"):
            raise VolumeError(f"the {DRIVER} volume driver takes no options")
        self._make(name)
        return {}

    def remove(self, request: dict[str, Any]) -> dict[str, Any]:
        name = self._name(request)
        path = self.directory / name
        if self.mounts.mounted(path):
            raise VolumeError(f"volume {name} is in use by a container")
        with contextlib.suppress(FileNotFoundError):  # a ring re-created while unmounted
            (path / RING_FILE).unlink()
        with contextlib.suppress(FileNotFoundError):
            path.rmdir()
        self._set_owner(name, None)
        return {}

    def mount(self, request: dict[str, Any]) -> dict[str, Any]:
        name, mount_id = self._name(request), request.get("ID")
        if not isinstance(mount_id, str) or not mount_id:
            raise VolumeError("Mount without an ID")
        if not _MOUNT_ID.fullmatch(mount_id):
            raise VolumeError(f"bad mount ID {mount_id[:80]!r}")
        path = self._make(name)
        if self.mounts.mounted(path):
            if self._owners.get(name) == mount_id:
                return {"Mountpoint": str(path)}
            raise VolumeError(f"volume {name} is mounted by another container: each "
                              f"container needs a {DRIVER} volume of its own (leave out "
                              "the source: an anonymous volume)")
        with contextlib.suppress(FileNotFoundError):  # re-created while it was unmounted
            (path / RING_FILE).unlink()
        self.mounts.mount(path, self.size)
        try:
            create_ring(path / RING_FILE, self.capacity)
        except (OSError, ValueError) as e:
            self.mounts.unmount(path)
            raise VolumeError(f"cannot make the ring of volume {name}: {e}") from None
        self._set_owner(name, mount_id)
        log.info("volume %s: mounted, ring %s", name, path / RING_FILE)
        return {"Mountpoint": str(path)}

    def unmount(self, request: dict[str, Any]) -> dict[str, Any]:
        name, mount_id = self._name(request), request.get("ID")
        owner = self._owners.get(name)
        if owner is not None and owner != mount_id:
            return {}  # not the container that holds it
        path = self.directory / name
        if self.mounts.mounted(path):
            self.mounts.unmount(path)
            log.info("volume %s: unmounted", name)
        self._set_owner(name, None)
        return {}

    def path(self, request: dict[str, Any]) -> dict[str, Any]:
        path = self._existing(self._name(request))
        return {"Mountpoint": str(path) if self.mounts.mounted(path) else ""}

    def get(self, request: dict[str, Any]) -> dict[str, Any]:
        name = self._name(request)
        return {"Volume": self._describe(name, self._existing(name))}

    def list(self, request: dict[str, Any]) -> dict[str, Any]:
        with os.scandir(self.directory) as entries:
            names = sorted(e.name for e in entries
                           if e.is_dir(follow_symlinks=False) and _VOLUME_NAME.fullmatch(e.name))
        return {"Volumes": [self._describe(n, self.directory / n) for n in names]}

    # --- internals ---------------------------------------------------------------------

    @staticmethod
    def _name(request: dict[str, Any]) -> str:
        name = request.get("Name")
        if not isinstance(name, str) or not _VOLUME_NAME.fullmatch(name):
            raise VolumeError(f"bad volume name {str(name)[:80]!r}")
        return name

    def _make(self, name: str) -> Path:
        path = self.directory / name
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o755)
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise VolumeError(f"{path} is not a directory")
        return path

    def _owner_file(self, name: str) -> Path:
        return self.directory / f".{name}{OWNER_SUFFIX}"

    def _set_owner(self, name: str, mount_id: str | None) -> None:
        """Records who holds volume `name` (None: nobody), in memory and beside it, so that
        a restarted daemon knows it too (the root-only directory: no container writes
        there)."""
        path = self._owner_file(name)
        if mount_id is None:
            self._owners.pop(name, None)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return
        staged = path.with_name(path.name + ".new")
        staged.write_text(mount_id)
        staged.replace(path)
        self._owners[name] = mount_id

    def _load_owners(self) -> dict[str, str]:
        """The owners a previous run recorded of the volumes still mounted; the records of
        the others are stale, and removed."""
        owners = {}
        with os.scandir(self.directory) as entries:
            records = [e.name for e in entries if e.name.startswith(".")
                       and e.name.endswith(OWNER_SUFFIX) and e.is_file(follow_symlinks=False)]
        for record in records:
            name = record[1:-len(OWNER_SUFFIX)]
            try:
                mount_id = (self.directory / record).read_text()[:300]
            except (OSError, UnicodeDecodeError):
                mount_id = ""
            if (_VOLUME_NAME.fullmatch(name) and _MOUNT_ID.fullmatch(mount_id)
                    and self.mounts.mounted(self.directory / name)):
                owners[name] = mount_id
            else:
                with contextlib.suppress(FileNotFoundError):
                    (self.directory / record).unlink()
        return owners

    def _existing(self, name: str) -> Path:
        path = self.directory / name
        if not path.is_dir() or path.is_symlink():
            raise VolumeError(f"no volume {name}")
        return path

    def _describe(self, name: str, path: Path) -> dict[str, Any]:
        mounted = self.mounts.mounted(path)
        return {"Name": name, "Mountpoint": str(path) if mounted else "",
                "Status": {"mounted": mounted, "ring": str(path / RING_FILE)}}


_ENDPOINTS: dict[str, Callable[[VolumeDriver, dict[str, Any]], dict[str, Any]]] = {
    "/Plugin.Activate": VolumeDriver.activate,
    "/VolumeDriver.Capabilities": VolumeDriver.capabilities,
    "/VolumeDriver.Create": VolumeDriver.create,
    "/VolumeDriver.Remove": VolumeDriver.remove,
    "/VolumeDriver.Mount": VolumeDriver.mount,
    "/VolumeDriver.Unmount": VolumeDriver.unmount,
    "/VolumeDriver.Path": VolumeDriver.path,
    "/VolumeDriver.Get": VolumeDriver.get,
    "/VolumeDriver.List": VolumeDriver.list,
}


class _Handler(http.server.BaseHTTPRequestHandler):
    """One connection, one request: it must arrive whole within REQUEST_TIMEOUT_S (a
    client dripping bytes is cut off then), and the reply waits for nothing but the
    driver."""

    server: _Server
    timeout = REQUEST_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the socket's own reader: each read would get the whole timeout
        self.rfile = io.BufferedReader(_ByDeadline(self.connection, REQUEST_TIMEOUT_S))

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_REQUEST:
            reply: dict[str, Any] = {"Err": f"request body must be 0 to {MAX_REQUEST} bytes"}
        else:
            try:
                request = json.loads(self.rfile.read(length) or b"{}")
            except (ValueError, RecursionError):
                request = None
            self.connection.settimeout(self.timeout)  # read: now for the reply
            reply = ({"Err": "request is not valid JSON"} if request is None
                     else self.server.driver.handle(self.path, request))
        body = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.docker.plugins.v1.2+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self) -> str:
        return "docker"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("volume driver: " + format, *args)


class _ByDeadline(io.RawIOBase):
    """A socket's reads, each given what is left of one deadline as its timeout: however a
    client paces its bytes, its request is cut off at the deadline."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self._sock = sock
        self._deadline = time.monotonic() + seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """Serves each connection in a thread of its own, at most MAX_CONNECTIONS at once."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, path: Path, driver: VolumeDriver) -> None:
        self.driver = driver
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._errors = RateLimitedLog(log)
        super().__init__(str(path), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            self._errors.log(logging.WARNING, "full", "volume driver: %d connections "
                             "already: one closed unanswered", MAX_CONNECTIONS)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One line at most a minute: a client that hangs up before its reply (or is cut
        off) is its own affair, not a traceback in the daemon's log."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            self._errors.log(logging.INFO, "client", "volume driver: a client's connection "
                             "failed: %s", error.strerror or error)
        else:
            self._errors.log(logging.ERROR, "bug", "volume driver: a request failed",
                             exc_info=True)


class VolumePlugin:
    """Serves the driver on RUN_DIR/plugin.sock (mode 0600: dockerd runs as root), each
    connection in a thread of its own (the driver runs one request at a time)."""

    def __init__(self, driver: VolumeDriver, path: Path) -> None:
        self.path = path
        with contextlib.suppress(FileNotFoundError):  # a stale socket of a previous run
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                path.unlink()
        old = os.umask(0o177)
        try:
            self._server = _Server(path, driver)
        finally:
            os.umask(old)
        self._server.socket.set_inheritable(False)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="dqoes-volumes", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def plugin_spec(path: Path) -> str:
    """The content of Docker's spec file for the driver served at `path`."""
    return f"unix://{path}\n"


__all__ = ["DRIVER", "KernelMounts", "Mounts", "SystemdMounts", "VolumeDriver", "VolumeError",
           "VolumePlugin", "default_mounts", "plugin_spec"]
