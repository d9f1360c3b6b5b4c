"""One stage of a lab pipeline: a small TCP service that receives a request from the stage
before it, does its model work (lab/workload.py's numpy network), records its latency into
its dqoes ring, forwards the request to its next stage(s) by name, and answers the stage
before it once every next stage answered.

    python -m lab.pipeline_stage --name detect --model micro --port 7000 \
        --next analyze:7000 [--next recognize:7000] [--ring PATH]

The wire (tcp, one request at a time per connection, a connection may carry many): a frame
is a 4-byte big-endian length and that many bytes of JSON, at most MAX_FRAME. A request is
{"id": N}; its answer {"id": N, "hops": [[stage, seconds], ...]}: each stage's latency, this
stage's first, then its next stages'; or {"id": N, "error": "one line"}. A stage's latency,
what its ring gets, is its receipt of the request to its work done (its queue included) plus
what forwarding it took beyond its next stages' own latencies (connecting, sending, the
answer's way back): along a chain the stages' latencies add up to the first stage's
receipt-to-answer, so the time between stages, which no node would measure otherwise, is in
the shares of the target the stages are held to.

A next stage's name is looked up at most every RESOLVE_TTL_S and one of its addresses taken
at random for each request: on Swarm, with `--endpoint-mode dnsrr`, that spreads the
requests over the service's replicas. Everything a peer sends is hostile: a frame over
MAX_FRAME, bad JSON, a peer that stalls mid-frame or past its deadline gets one error line
(where it can still be sent) and its connection closed; past MAX_CONNECTIONS a new
connection is refused with one, past a full queue a request is, and a next stage that does
not answer within the deadline makes the request fail, never the stage hang.

Stopped (SIGTERM: Swarm moving or removing a replica), a stage drains: it stops listening
(a caller's connection is refused and it retries another of the name's addresses) and
answers every request it has taken, then exits, within DRAIN_S (give the service a
`--stop-grace-period` longer than that).
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_FRAME = 16 * 1024  # bytes of one request or answer
MAX_HOPS = 32  # stages in one answer (a pipeline has at most 32)
MAX_CONNECTIONS = 64  # at once, each a thread
QUEUE = 32  # requests waiting for the worker
IO_TIMEOUT_S = 10.0  # a peer's silence mid-frame, or between requests, before it is dropped
DEADLINE_S = 60.0  # a request's time in this stage and past it, before it fails
RESOLVE_TTL_S = 2.0  # how long a next stage's addresses are used before a new lookup
DRAIN_S = 20.0  # a stopped stage's most time to answer the requests it has taken
RETRY_S = 10.0  # how long a next stage whose every address refuses is tried again
RETRY_PAUSE_S, RETRY_PAUSE_MAX_S = 0.1, 1.0  # the pause between such tries: first, most
_LENGTH = struct.Struct(">I")


class FrameError(Exception):
    """What a peer sent (or did not send) is not a frame: one line saying why."""


def send_frame(sock: socket.socket, doc: dict[str, Any]) -> None:
    body = json.dumps(doc, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise FrameError(f"a frame of {len(body)} bytes, over {MAX_FRAME}")
    sock.sendall(_LENGTH.pack(len(body)) + body)


def recv_frame(sock: socket.socket, deadline: float, silence_s: float | None = None,
               ) -> dict[str, Any] | None:
    """The next frame's JSON object; None if the peer closed before one began. Raises
    FrameError for a bad one, TimeoutError past `deadline` (time.monotonic()) or after
    `silence_s` without a byte."""
    head = _recv_exactly(sock, _LENGTH.size, deadline, silence_s, may_end=True)
    if head is None:
        return None
    (length,) = _LENGTH.unpack(head)
    if length > MAX_FRAME:
        raise FrameError(f"a frame of {length} bytes, over {MAX_FRAME}")
    body = _recv_exactly(sock, length, deadline, silence_s, may_end=False)
    assert body is not None
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise FrameError(f"not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise FrameError("not a JSON object")
    return doc


def _recv_exactly(sock: socket.socket, n: int, deadline: float, silence_s: float | None,
                  may_end: bool) -> bytes | None:
    data = bytearray()
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        sock.settimeout(left if silence_s is None else min(left, silence_s))
        chunk = sock.recv(n - len(data))
        if not chunk:
            if may_end and not data:
                return None
            raise FrameError(f"connection closed after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)


def request_id(doc: dict[str, Any]) -> int:
    rid = doc.get("id")
    if type(rid) is not int or not 0 <= rid < 2**53:
        raise FrameError("no integer id in [0, 2**53)")
    return rid


def hops_of(doc: dict[str, Any]) -> list[tuple[str, float]]:
    """An answer's hops, checked: at most MAX_HOPS [stage, seconds] pairs."""
    hops = doc.get("hops")
    if not isinstance(hops, list) or len(hops) > MAX_HOPS:
        raise FrameError(f"no list of at most {MAX_HOPS} hops")
    checked = []
    for hop in hops:
        if not (isinstance(hop, list) and len(hop) == 2 and isinstance(hop[0], str)
                and len(hop[0]) <= 64 and type(hop[1]) in (int, float) and 0 <= hop[1] < 1e6):
            raise FrameError("a hop that is not [stage, seconds]")
        checked.append((hop[0], float(hop[1])))
    return checked


_resolved: dict[tuple[str, int], tuple[float, list[Any]]] = {}  # address: (expiry, infos)


def _resolve(address: tuple[str, int]) -> list[Any]:
    """The addresses of a name, looked up at most every RESOLVE_TTL_S: a lookup per request
    (Docker's resolver, in dockerd) cost more than a stage's work on the emulated CPU,
    while a replica started or gone is seen within the TTL, as with a DNS cache."""
    now = time.monotonic()
    cached = _resolved.get(address)
    if cached is not None and cached[0] > now:
        return cached[1]
    infos = socket.getaddrinfo(*address, socket.AF_INET, socket.SOCK_STREAM)
    _resolved[address] = (now + RESOLVE_TTL_S, infos)
    return infos


def _connect(address: tuple[str, int], deadline: float) -> socket.socket:
    """A connection to one of the name's addresses, at random. A refused one (a replica
    gone since the lookup, or one that Swarm runs and its DNS names before its process
    listens: a move, a scale out or in) is not tried again while the name, looked up
    afresh, has another; when every one refused (a lone replica being replaced), they are
    all tried again after a pause growing from RETRY_PAUSE_S, for up to RETRY_S, as a client
    that retries its endpoints does."""
    refused: set[Any] = set()
    pause, give_up = RETRY_PAUSE_S, min(deadline, time.monotonic() + RETRY_S)
    while True:
        untried = [info for info in _resolve(address) if info[4] not in refused]
        if not untried:
            if time.monotonic() + pause > give_up:
                raise ConnectionRefusedError(f"{address[0]}:{address[1]}: every address "
                                             f"refused for {RETRY_S:g} s")
            time.sleep(pause)
            pause, refused = min(2 * pause, RETRY_PAUSE_MAX_S), set()
            continue
        info = random.choice(untried)
        try:
            return _open(info, deadline)
        except ConnectionRefusedError:
            refused.add(info[4])
            _resolved.pop(address, None)


def _open(info: Any, deadline: float) -> socket.socket:
    family, kind, proto, _, sockaddr = info
    sock = socket.socket(family, kind, proto)
    try:
        sock.settimeout(max(0.001, min(deadline - time.monotonic(), IO_TIMEOUT_S)))
        sock.connect(sockaddr)
    except OSError:
        sock.close()
        raise
    return sock


def call(address: tuple[str, int], rid: int, deadline: float) -> list[tuple[str, float]]:
    """Send request `rid` to the stage at `address` (its name looked up at most every
    RESOLVE_TTL_S, one of its addresses taken at random) on a connection of its own; its
    answer's hops. Raises OSError, TimeoutError or FrameError (an error answer is one
    too)."""
    host, port = address
    with _connect(address, deadline) as sock:
        send_frame(sock, {"id": rid})
        answer = recv_frame(sock, deadline)
    if answer is None:
        raise FrameError(f"{host}:{port} closed without an answer")
    if "error" in answer:
        raise FrameError(f"{host}:{port}: {str(answer['error'])[:200]}")
    return hops_of(answer)


@dataclass
class _Job:
    received: float  # time.monotonic() when its frame was read
    done: threading.Event = field(default_factory=threading.Event)
    abandoned: bool = False  # its connection gave up waiting: the worker skips it
    latency_s: float = 0.0  # its receipt to its work done


class StageServer:
    """A stage listening on `port` (0: any free one, see .port). One worker thread does the
    model work, first come first served; each connection has a thread of its own, which
    waits for its request's work and then forwards it."""

    def __init__(self, name: str, work: Callable[[], object], record: Callable[[float], None],
                 next_stages: Sequence[tuple[str, int]] = (), host: str = "0.0.0.0",
                 port: int = 0, deadline_s: float = DEADLINE_S) -> None:
        self.name = name
        self.work = work
        self.record = record
        self.next_stages = tuple(next_stages)
        self.deadline_s = deadline_s
        self.refused: dict[str, int] = {}  # one-line reason: count
        self._listener = socket.create_server((host, port), backlog=MAX_CONNECTIONS)
        self.port = self._listener.getsockname()[1]
        self._jobs: queue.Queue[_Job] = queue.Queue(QUEUE)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._stopping = threading.Event()
        self._draining = threading.Event()
        self._lock = threading.Lock()
        self._taken = 0  # requests read and not yet answered
        self._answered = threading.Condition(self._lock)
        self._threads = [threading.Thread(target=self._accept, daemon=True),
                         threading.Thread(target=self._serve, daemon=True)]

    def start(self) -> StageServer:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._close_listener()
        for thread in self._threads:
            thread.join(timeout=IO_TIMEOUT_S)

    def drain(self, within_s: float = DRAIN_S) -> int:
        """Stop listening, answer every request taken (a connection closes after its
        answer), then stop; the requests still unanswered after `within_s` (0 normally)."""
        self._draining.set()
        self._close_listener()
        deadline = time.monotonic() + within_s
        with self._answered:
            while self._taken and self._answered.wait(max(0.0, deadline - time.monotonic())):
                pass
            left = self._taken
        self.stop()
        return left

    def _close_listener(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept(); close() alone does not
        except OSError:
            pass
        self._listener.close()

    def _refuse(self, reason: str) -> None:
        with self._lock:
            self.refused[reason] = self.refused.get(reason, 0) + 1

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed by stop()
            if not self._slots.acquire(blocking=False):
                self._refuse("too many connections")
                _answer_quietly(conn, {"id": 0, "error": f"over {MAX_CONNECTIONS} connections"})
                conn.close()
                continue
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        try:
            with conn:
                while not self._stopping.is_set() and not self._draining.is_set():
                    try:
                        doc = recv_frame(conn, time.monotonic() + IO_TIMEOUT_S,
                                         IO_TIMEOUT_S)
                        if doc is None:
                            return
                        rid = request_id(doc)
                    except (FrameError, TimeoutError) as e:
                        self._refuse(str(e).split(":")[0])
                        _answer_quietly(conn, {"id": 0, "error": str(e)[:200]})
                        return
                    with self._lock:
                        self._taken += 1
                    try:
                        send_frame(conn, self._handle(rid))
                    finally:
                        with self._answered:
                            self._taken -= 1
                            self._answered.notify_all()
        except OSError:
            pass  # the peer went away: its request is lost to it alone
        finally:
            self._slots.release()

    def _handle(self, rid: int) -> dict[str, Any]:
        """Queue, work, forward: the answer to request `rid`."""
        job = _Job(time.monotonic())
        deadline = job.received + self.deadline_s
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            self._refuse("queue full")
            return {"id": rid, "error": f"{self.name}: {QUEUE} requests queued already"}
        if not job.done.wait(self.deadline_s):
            job.abandoned = True
            return {"id": rid, "error": f"{self.name}: not served within {self.deadline_s} s"}
        latency, after = job.latency_s, []
        for address in self.next_stages:
            started = time.monotonic()
            try:
                answered = call(address, rid, deadline)
            except (OSError, TimeoutError, FrameError) as e:
                self.record(latency + time.monotonic() - started)
                return {"id": rid, "error": f"{self.name} -> {e}"[:200]}
            latency += max(0.0, time.monotonic() - started - sum(s for _, s in answered))
            after += answered
        self.record(latency)
        return {"id": rid, "hops": [(self.name, latency), *after][:MAX_HOPS]}

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                job = self._jobs.get(timeout=0.5)
            except queue.Empty:
                continue
            if job.abandoned:
                continue
            self.work()
            job.latency_s = time.monotonic() - job.received
            job.done.set()


def _answer_quietly(conn: socket.socket, doc: dict[str, Any]) -> None:
    """One error line to a peer we are dropping, if it still reads."""
    try:
        conn.settimeout(1.0)
        send_frame(conn, doc)
    except OSError:
        pass


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME:PORT")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    from dqoes_cg.probe import Probe

    p = argparse.ArgumentParser(prog="python -m lab.pipeline_stage", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True, help="this stage's name (in the answers' hops)")
    p.add_argument("--model", default="micro", help="one of lab.workload's MODELS")
    p.add_argument("--port", type=int, default=7000)
    p.add_argument("--next", type=parse_address, action="append", default=[],
                   metavar="NAME:PORT", help="a next stage (repeat to fan out; none: a sink)")
    p.add_argument("--ring", default=None, help="ring file (default: $DQOES_RING or the "
                   "probe's default path)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    with Probe.open(args.ring) as probe:
        # Listening before the model loads (seconds, on an emulated CPU): Swarm counts a
        # task as running, and its name resolves to it, from its start, so a caller's
        # connection waits in the backlog until it serves instead of being refused.
        server = StageServer(args.name, lambda: None, probe.record, args.next,
                             port=args.port)
        from lab.workload import MODELS, build_model  # numpy: seconds to import, emulated

        if args.model not in MODELS:
            p.error(f"--model: one of {', '.join(sorted(MODELS))}")
        infer = build_model(args.model, args.seed)
        infer()  # warm-up, unrecorded
        server.work = infer  # before start(): no request is served until then
        server.start()
        print(f"stage {args.name} listening on port {server.port}, next "
              f"{[f'{h}:{p}' for h, p in args.next] or 'none'}", flush=True)
        try:
            stopped.wait()
            left = server.drain()
            print(f"stage {args.name} drained"
                  + (f", {left} requests unanswered after {DRAIN_S:g} s" if left else ""),
                  flush=True)
        except KeyboardInterrupt:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
