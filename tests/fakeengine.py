"""A fake container engine for unit tests of the watcher: Docker's Engine API over a unix
socket, with the few endpoints dqoesd reads, containers and services set by the test, and
an event stream it feeds. `restart()` ends every stream, as a dockerd going away does; a
stream also ends at its `until`, and `drop` keeps the next events from every stream, as
Docker does when a reader is slow."""

from __future__ import annotations

import http.server
import json
import queue
import socketserver
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

STOP = object()


class FakeEngine:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.containers: dict[str, dict[str, Any]] = {}  # ID -> inspect document
        self.services: list[dict[str, Any]] | None = None  # None: not a manager (503)
        self.requests = 0
        self.volume_filters: list[Any] = []  # the filters of each GET /volumes
        self.volumes_delay_s = 0.0  # before it answers GET /volumes
        self.subscriptions: list[tuple[int, int]] = []  # (since, until) of each GET /events
        self.drop = 0  # how many of the next events no stream gets
        self._streams: list[queue.SimpleQueue[Any]] = []
        self._lock = threading.Lock()
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                engine.requests += 1
                url = urllib.parse.urlparse(self.path)
                path = url.path.removeprefix("/v1.41")
                if path == "/events":
                    query = urllib.parse.parse_qs(url.query)
                    since, until = int(query["since"][0]), int(query["until"][0])
                    engine.subscriptions.append((since, until))
                    return self._stream(until)
                if path == "/containers/json":
                    return self._json(200, [{"Id": i} for i, c in engine.containers.items()
                                            if c["State"]["Running"]])
                if path.startswith("/containers/") and path.endswith("/json"):
                    key = urllib.parse.unquote(path.split("/")[2])
                    doc = engine.containers.get(key) or next(
                        (c for c in engine.containers.values() if c["Name"] == "/" + key), None)
                    return self._json(200, doc) if doc else self._json(404, {"message": "no"})
                if path == "/volumes":
                    time.sleep(engine.volumes_delay_s)
                    query = urllib.parse.parse_qs(url.query)
                    engine.volume_filters.append(json.loads(query["filters"][0]))
                    return self._json(200, {"Volumes": [], "Warnings": None})
                if path == "/services":
                    if engine.services is None:
                        return self._json(503, {"message": "This node is not a swarm manager."})
                    return self._json(200, engine.services)
                return self._json(404, {"message": "page not found"})

            def do_POST(self) -> None:
                """A node's update, as Docker answers it: 200 and no body."""
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                path = urllib.parse.urlparse(self.path).path.removeprefix("/v1.41")
                if path.startswith("/nodes/") and path.endswith("/update"):
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                return self._json(404, {"message": "page not found"})

            def _json(self, status: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _stream(self, until: int) -> None:
                q: queue.SimpleQueue[Any] = queue.SimpleQueue()
                with engine._lock:
                    engine._streams.append(q)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                try:
                    while (event := self._next(q, until)) is not STOP:
                        line = event if isinstance(event, bytes) else \
                            json.dumps(event).encode() + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    pass
                finally:
                    with engine._lock:
                        engine._streams.remove(q)
                self.close_connection = True

            @staticmethod
            def _next(q: queue.SimpleQueue[Any], until: int) -> Any:
                try:
                    return q.get(timeout=max(0.0, until - time.time()))
                except queue.Empty:
                    return STOP

            def log_message(self, *args: Any) -> None:
                pass

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self._server = Server(str(path), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def streams(self) -> int:
        with self._lock:
            return len(self._streams)

    def add(self, cid: str, name: str, labels: dict[str, str] | None = None, pid: int = 0,
            running: bool = True, volumes: tuple[tuple[str, str], ...] = ()) -> None:
        self.containers[cid] = {
            "Id": cid, "Name": "/" + name, "State": {"Running": running, "Pid": pid},
            "Config": {"Labels": labels}, "Mounts": [
                {"Type": "volume", "Driver": d, "Name": v, "Destination": "/run/dqoes"}
                for d, v in volumes]}

    def event(self, kind: str, action: str, oid: str) -> None:
        self.send({"Type": kind, "Action": action, "Actor": {"ID": oid, "Attributes": {}}})

    def send(self, event: Any) -> None:
        with self._lock:
            if self.drop:
                self.drop -= 1
                return
            for q in self._streams:
                q.put(event)

    def restart(self) -> None:
        """Every event stream ends (dockerd went away and came back)."""
        with self._lock:
            for q in self._streams:
                q.put(STOP)

    def close(self) -> None:
        self.restart()
        self._server.shutdown()
        self._server.server_close()
