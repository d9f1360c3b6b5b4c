"""The lab pipeline's stages (lab/pipeline_stage.py) chained over localhost carry requests
end to end under the open-loop load generator (lab/pipeline_load.py), each stage's latency
in its answer and its ring; their bounds hold against hostile peers; the interference
injector's schedule (lab/injector.py)."""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from itertools import pairwise

import numpy as np
import pytest

from lab import pipeline_stage
from lab.injector import LEVELS, DockerHog, Injector, hog_schedule
from lab.pipeline_load import Burst, Phase, arrivals, run, summary
from lab.pipeline_stage import MAX_FRAME, QUEUE, FrameError, StageServer, call, recv_frame
from lab.workload import build_model

STAGES = ("framer", "detector", "analyzer", "recognizer", "uploader")


class Recorder:
    """A stage's ring, in memory."""

    def __init__(self) -> None:
        self.latencies: list[float] = []

    def record(self, seconds: float) -> None:
        self.latencies.append(seconds)


def _chain(work: Callable[[], object], deadline_s: float = pipeline_stage.DEADLINE_S,
           ) -> tuple[list[StageServer], list[Recorder]]:
    """The five stages, each forwarding to the next by 127.0.0.1:port, the last a sink."""
    servers: list[StageServer] = []
    recorders = [Recorder() for _ in STAGES]
    for name, recorder in zip(reversed(STAGES), reversed(recorders), strict=True):
        nexts = [("127.0.0.1", servers[0].port)] if servers else []
        servers.insert(0, StageServer(name, work, recorder.record, nexts, host="127.0.0.1",
                                      deadline_s=deadline_s).start())
    return servers, recorders


@pytest.fixture
def chain() -> Iterator[tuple[list[StageServer], list[Recorder]]]:
    servers, recorders = _chain(build_model("micro"))
    yield servers, recorders
    for server in servers:
        server.stop()


def test_five_stages_carry_open_loop_requests_end_to_end(chain) -> None:  # type: ignore[no-untyped-def]
    servers, recorders = chain
    times = arrivals([Phase(1.0, 20.0), Phase(1.0, 40.0)], [Burst(0.5, 10)], seed=3)
    outcomes = run(("127.0.0.1", servers[0].port), times)
    doc = summary(outcomes, 2.0)
    print({k: v for k, v in doc.items() if k != "errors"})
    assert doc["answered"] == doc["requests"] == len(times), doc["errors"]
    for o in outcomes:
        assert [stage for stage, _ in o.hops] == list(STAGES)
        # each stage's own latency is within the request's end to end (one clock)
        assert sum(seconds for _, seconds in o.hops) <= o.latency_s
    for recorder in recorders:  # each stage's ring got each request's latency
        assert len(recorder.latencies) == len(times)
    assert set(doc["stage_mean_s"]) == set(STAGES)
    assert sum(doc["stage_share"].values()) <= 1.0


def test_arrivals_are_seeded_open_loop_phases_and_bursts() -> None:
    a = arrivals([Phase(100.0, 2.0), Phase(100.0, 8.0)], [Burst(50.0, 30)], seed=1)
    assert np.array_equal(a, arrivals([Phase(100.0, 2.0), Phase(100.0, 8.0)],
                                      [Burst(50.0, 30)], seed=1))
    assert np.all(np.diff(a) >= 0)
    first, second = np.sum(a < 100) - 30, np.sum(a >= 100)
    assert 120 < first < 280 and 650 < second < 950  # Poisson counts: 200 and 800 expected
    assert np.sum(a == 50.0) == 30


def _raw(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    return sock


def test_an_oversized_or_malformed_request_gets_one_error_and_the_stage_serves_on(chain) -> None:  # type: ignore[no-untyped-def]
    servers, _ = chain
    port = servers[0].port
    for frame in (struct.pack(">I", 1 << 30), struct.pack(">I", 3) + b"{x}",
                  struct.pack(">I", 2) + b"[]", struct.pack(">I", 9) + b'{"id":-1}'):
        with _raw(port) as sock:
            sock.sendall(frame)
            answer = recv_frame(sock, time.monotonic() + 60)
            assert answer is not None and "error" in answer, answer
            assert recv_frame(sock, time.monotonic() + 60) is None  # then closed
    with pytest.raises(FrameError, match=f"over {MAX_FRAME}"):
        pipeline_stage.send_frame(_raw(port), {"id": 1, "pad": "x" * MAX_FRAME})
    assert [s for s, _ in call(("127.0.0.1", port), 7, time.monotonic() + 60)] == list(STAGES)


def test_a_stalled_peer_holds_only_its_own_connection(chain, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    servers, _ = chain
    with _raw(servers[0].port) as stalled:
        stalled.sendall(struct.pack(">I", 100) + b"{")  # half a frame, then silence
        hops = call(("127.0.0.1", servers[0].port), 1, time.monotonic() + 60)
        assert [s for s, _ in hops] == list(STAGES)
        # and the stalled one is dropped with one error line once its time is up
        answer = recv_frame(stalled, time.monotonic() + 120)
        assert answer is not None and answer["error"] == "timed out", answer


def test_a_next_stage_that_never_answers_fails_the_request_within_its_deadline() -> None:
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    stage = StageServer("last", lambda: None, Recorder().record,
                        [("127.0.0.1", silent.getsockname()[1])], host="127.0.0.1",
                        deadline_s=2.0).start()
    try:
        with pytest.raises(FrameError, match=r"last -> "):
            call(("127.0.0.1", stage.port), 1, time.monotonic() + 120)
    finally:
        stage.stop()
        silent.close()


def test_a_stages_latency_holds_the_time_its_forwarding_took_beyond_the_next_stages() -> None:
    """The time between stages (here a next stage that answers 0.5 s after it took the
    request while its hops say 0.1 s) is in the forwarding stage's latency, so the stages'
    latencies add up to the first stage's receipt-to-answer."""
    slow = socket.create_server(("127.0.0.1", 0))

    def answer_late() -> None:
        conn, _ = slow.accept()
        with conn:
            doc = recv_frame(conn, time.monotonic() + 60)
            time.sleep(0.5)  # the way there and back, as the forwarding stage sees it
            pipeline_stage.send_frame(conn, {"id": doc["id"] if doc else 0,
                                             "hops": [["sink", 0.1]]})

    threading.Thread(target=answer_late, daemon=True).start()
    recorder = Recorder()
    stage = StageServer("first", lambda: None, recorder.record,
                        [("127.0.0.1", slow.getsockname()[1])], host="127.0.0.1").start()
    try:
        hops = call(("127.0.0.1", stage.port), 1, time.monotonic() + 120)
    finally:
        stage.stop()
        slow.close()
    assert [s for s, _ in hops] == ["first", "sink"]
    assert recorder.latencies == [hops[0][1]]
    assert hops[0][1] >= 0.4


def test_a_full_queue_refuses_requests_and_the_others_are_served() -> None:
    release = threading.Event()
    stage = StageServer("slow", lambda: release.wait(120), Recorder().record,
                        host="127.0.0.1").start()
    results: list[str] = []
    lock = threading.Lock()

    def send(i: int) -> None:
        try:
            call(("127.0.0.1", stage.port), i, time.monotonic() + 300)
            outcome = "answered"
        except FrameError as e:
            outcome = str(e)
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(QUEUE + 8)]
    try:
        for thread in threads:
            thread.start()
        # Released only once every request past the worker's one and the queue's has been
        # refused: on a loaded host, requests released earlier would find room and be served.
        deadline = time.monotonic() + 120
        while (stage.refused.get("queue full", 0) < len(threads) - QUEUE - 1
               and time.monotonic() < deadline):
            time.sleep(0.05)
        release.set()
        for thread in threads:
            thread.join()
    finally:
        release.set()
        stage.stop()
    refused = [r for r in results if "queued already" in r]
    assert refused and len(refused) + results.count("answered") == len(threads), results
    assert results.count("answered") <= QUEUE + 1


def test_past_its_connection_limit_a_stage_refuses_with_one_line(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(pipeline_stage, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(pipeline_stage, "IO_TIMEOUT_S", 300.0)
    stage = StageServer("few", lambda: None, Recorder().record, host="127.0.0.1").start()
    held = [_raw(stage.port) for _ in range(4)]
    try:
        with _raw(stage.port) as extra:
            answer = recv_frame(extra, time.monotonic() + 60)
        assert answer == {"id": 0, "error": "over 4 connections"}
    finally:
        for sock in held:
            sock.close()
        stage.stop()


def test_the_hog_schedule_is_seeded_and_changes_level_at_random_times() -> None:
    schedule = hog_schedule(600.0, mean_hold_s=60.0, seed=2)
    assert schedule == hog_schedule(600.0, mean_hold_s=60.0, seed=2)
    assert schedule != hog_schedule(600.0, mean_hold_s=60.0, seed=3)
    times = [t for t, _ in schedule]
    levels = [level for _, level in schedule]
    assert times[0] == 0.0 and all(b > a for a, b in pairwise(times)) and times[-1] < 600
    assert set(levels) <= set(LEVELS) and all(a != b for a, b in pairwise(levels))


def test_the_injector_applies_its_schedule_in_order_and_removes_the_hog() -> None:
    class Recording:
        def __init__(self) -> None:
            self.calls: list[object] = []

        def set(self, level: float) -> None:
            self.calls.append(level)

        def remove(self) -> None:
            self.calls.append("removed")

    hog = Recording()
    injector = Injector(hog, [(0.0, 0.5), (0.05, 0.0), (0.1, 0.75)]).start()
    deadline = time.monotonic() + 60
    while not injector.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    injector.stop()
    assert hog.calls == [0.5, 0.0, 0.75, "removed"]
    assert [level for _, level in injector.changes] == [0.5, 0.0, 0.75]


def test_a_docker_hog_is_capped_at_its_share_of_the_node() -> None:
    argv = DockerHog(["docker", "--host", "unix:///n1.sock"], node_cpus=0.5).start_argv(0.75)
    assert argv[:4] == ["docker", "--host", "unix:///n1.sock", "run"]
    assert argv[argv.index("--cpus") + 1] == "0.375"
    with pytest.raises(ValueError, match="kind"):
        DockerHog(["docker"], 1.0, kind="disk")


def test_a_name_is_looked_up_once_per_ttl_and_again_when_its_replica_is_gone(
        monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A stage gone since the lookup (its port closed) refuses: the caller looks the name up
    again and reaches the one that runs; within the TTL no lookup is repeated."""
    sink = StageServer("sink", lambda: None, Recorder().record, host="127.0.0.1").start()
    with socket.socket() as gone:  # a port nothing listens on any more
        gone.bind(("127.0.0.1", 0))
        dead = gone.getsockname()[1]
    answers = [[(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", dead))],
               [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", sink.port))]]
    lookups: list[str] = []

    def lookup(host: str, *_: object) -> list[tuple[object, ...]]:
        lookups.append(host)
        return answers[min(len(lookups), 2) - 1]

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    monkeypatch.setattr(pipeline_stage, "_resolved", {})
    try:
        deadline = time.monotonic() + 10
        assert call(("sink", 7000), 1, deadline) == [("sink", pytest.approx(0, abs=5))]
        assert lookups == ["sink", "sink"], "refused: looked up again"
        assert call(("sink", 7000), 2, deadline)[0][0] == "sink"
        assert lookups == ["sink", "sink"], "within the TTL: no new lookup"
    finally:
        sink.stop()


def test_a_draining_stage_answers_what_it_took_and_refuses_new_connections() -> None:
    """Stopped by Swarm (a move), a stage answers the requests it has taken, the one in its
    worker and those queued, while a new caller's connection is refused at once."""
    release, working = threading.Event(), threading.Event()

    def work() -> None:
        working.set()
        release.wait(120)

    stage = StageServer("moving", work, Recorder().record, host="127.0.0.1").start()
    answers: list[object] = []

    def send(i: int) -> None:
        answers.append(call(("127.0.0.1", stage.port), i, time.monotonic() + 300))

    senders = [threading.Thread(target=send, args=(i,)) for i in range(3)]
    for sender in senders:
        sender.start()
    deadline = time.monotonic() + 120
    while stage._taken < 3 and time.monotonic() < deadline:  # all three read
        time.sleep(0.05)
    assert working.wait(120) and stage._taken == 3
    left: list[int] = []
    drainer = threading.Thread(target=lambda: left.append(stage.drain(within_s=300)))
    drainer.start()
    with pytest.raises(ConnectionRefusedError):  # no longer listening, while it drains
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            socket.create_connection(("127.0.0.1", stage.port), timeout=10).close()
            time.sleep(0.05)
    assert drainer.is_alive()
    release.set()
    for thread in (*senders, drainer):
        thread.join(timeout=120)
    assert left == [0] and len(answers) == 3


def test_a_stage_listens_from_its_construction_and_serves_once_started() -> None:
    """A stage's main builds it before its model loads: a caller that connects meanwhile (a
    new replica's name resolves from its start) waits in the backlog, and is served."""
    stage = StageServer("loading", lambda: None, Recorder().record, host="127.0.0.1")
    try:
        with socket.create_connection(("127.0.0.1", stage.port), timeout=60) as early:
            pipeline_stage.send_frame(early, {"id": 7})
            stage.start()
            assert recv_frame(early, time.monotonic() + 120) == {
                "id": 7, "hops": [["loading", pytest.approx(0, abs=60)]]}
    finally:
        stage.stop()


def test_a_refused_replica_is_not_tried_again_when_the_name_has_another(
        monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Swarm names a new replica before its process listens (and an old one until it is
    gone): the retry after a refusal takes one of the name's other addresses."""
    sink = StageServer("sink", lambda: None, Recorder().record, host="127.0.0.1").start()
    with socket.socket() as gone:
        gone.bind(("127.0.0.1", 0))
        dead = gone.getsockname()[1]
    both = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))
            for port in (dead, sink.port)]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *_: both)
    monkeypatch.setattr(pipeline_stage, "_resolved", {})
    monkeypatch.setattr(random, "choice", lambda seq: seq[0])  # the refused one first
    try:
        assert call(("sink", 7000), 1, time.monotonic() + 60)[0][0] == "sink"
    finally:
        sink.stop()


def test_a_lone_replica_that_refuses_is_tried_again_until_it_listens(
        monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A lone replica being replaced: its name has no other address, so the caller tries
    again after a pause, until its successor listens on it."""
    with socket.socket() as gone:
        gone.bind(("127.0.0.1", 0))
        port = gone.getsockname()[1]
    monkeypatch.setattr(pipeline_stage, "_resolved", {})
    monkeypatch.setattr(pipeline_stage, "RETRY_S", 600.0)
    tries, successor = [], []
    real_open = pipeline_stage._open

    def open_from_the_third_try(info, deadline):  # type: ignore[no-untyped-def]
        tries.append(info[4])
        if len(tries) == 3:  # the successor listens from now on
            successor.append(StageServer("sink", lambda: None, Recorder().record,
                                         host="127.0.0.1", port=port).start())
        return real_open(info, deadline)

    monkeypatch.setattr(pipeline_stage, "_open", open_from_the_third_try)
    try:
        hops = call(("127.0.0.1", port), 1, time.monotonic() + 600)
    finally:
        for sink in successor:
            sink.stop()
    assert hops[0][0] == "sink" and len(tries) == 3
