"""Latencies from a service's Prometheus histogram (histogram.py, scrape.py): the bucket
arithmetic, and the scrape of hostile endpoints (local HTTP servers on this host)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from dqoes_cg.cgroup import CRUN_SUBGROUP
from dqoes_cg.histogram import MAX, MEAN, Reading, window
from dqoes_cg.membership.objective import Scrape
from dqoes_cg.ring import STATS
from dqoes_cg.scrape import (
    Job,
    ScrapeError,
    Scraper,
    http_get,
    parse,
    scrape,
    socket_in_netns,
    timeout_for,
)
from lab.shell import wait_for

P50, P95 = STATS.index("p50"), STATS.index("p95")
INF = float("inf")


def reading(bounds: list[float], cumulative: list[float], total: float) -> Reading:
    return Reading(np.array(bounds), np.array(cumulative, float), cumulative[-1], total)


# --- the bucket arithmetic ---------------------------------------------------------------


def test_a_window_is_the_difference_of_two_readings() -> None:
    before = reading([0.1, 0.2, 0.4, INF], [5, 5, 5, 5], 0.25)
    after = reading([0.1, 0.2, 0.4, INF], [5, 55, 105, 105], 0.25 + 50 * 0.15 + 50 * 0.3)
    w = window(before, after)
    assert w is not None and w.count == 100
    assert w.stats[MEAN] == pytest.approx(0.225) and w.error[MEAN] == 0
    # rank 50 of 100: the last of the (0.1, 0.2] bucket; rank 95: 90% into (0.2, 0.4]
    assert w.stats[P50] == pytest.approx(0.2) and w.error[P50] == pytest.approx(0.1)
    assert w.stats[P95] == pytest.approx(0.38) and w.error[P95] == pytest.approx(0.2)
    assert w.stats[MAX] == pytest.approx(0.4)


def test_the_first_bucket_starts_at_zero_and_the_last_is_unbounded() -> None:
    before = reading([0.1, 1.0, INF], [0, 0, 0], 0)
    w = window(before, reading([0.1, 1.0, INF], [10, 10, 20], 100.0))
    assert w is not None and w.count == 20
    assert w.stats[P50] == pytest.approx(0.1) and w.error[P50] == pytest.approx(0.1)
    assert w.stats[P95] == 1.0 and w.error[P95] == INF  # the largest bound: no better
    assert w.stats[MAX] == 1.0 and w.error[MAX] == INF


def test_a_window_without_requests_has_no_reading() -> None:
    r = reading([0.1, INF], [3, 3], 0.1)
    w = window(r, r)
    assert w is not None and w.count == 0 and np.isnan(w.stats).all()


@pytest.mark.parametrize("after", [
    reading([0.1, 0.2, INF], [1, 2, 2], 0.2),  # a restart: fewer requests than before
    reading([0.1, 0.2, INF], [5, 9, 9], 0.1),  # the sum went back
    reading([0.1, 0.3, INF], [5, 9, 9], 1.0),  # other buckets
])
def test_a_reading_that_starts_over_gives_no_window(after: Reading) -> None:
    assert window(reading([0.1, 0.2, INF], [5, 8, 8], 0.8), after) is None


# --- parsing -----------------------------------------------------------------------------


def exposition(label_sets: int = 10, observations: int = 100, seed: int = 0) -> str:
    """What a service exports: prometheus_client's own histogram, with label sets."""
    registry = CollectorRegistry()
    h = Histogram("request_latency_seconds", "latency", ["model"], registry=registry)
    Counter("requests", "requests", registry=registry).inc()
    rng = np.random.default_rng(seed)
    for i in range(label_sets):
        for value in rng.exponential(0.05, observations):
            h.labels(model=f"m{i}").observe(value)
    return generate_latest(registry).decode()


def test_the_label_sets_of_a_real_histogram_are_added_up() -> None:
    r = parse(exposition(10, 100), "request_latency_seconds")
    assert r.count == 1000 and r.cumulative[-1] == 1000 and r.bounds[-1] == INF
    assert 1000 * 0.03 < r.sum < 1000 * 0.07


@pytest.mark.parametrize(("text", "reason"), [
    (exposition(), "no metric nothing_here there"),
    ("# TYPE nothing_here counter\nnothing_here_total 3\n", "is a counter, not a histogram"),
    ("nothing_here{ 3\n", "malformed metrics"),
    ("\x00\xff" * 1000, "malformed metrics"),
    ("# TYPE nothing_here histogram\nnothing_here_sum 3\n", "has no buckets"),
    ("# TYPE nothing_here histogram\nnothing_here_bucket{le=\"1\"} 3\n", "no +Inf bucket"),
    ("# TYPE nothing_here histogram\nnothing_here_bucket{le=\"1\"} 3\n"
     "nothing_here_bucket{le=\"+Inf\"} 2\n", "not cumulative"),
    ("# TYPE nothing_here histogram\nnothing_here_bucket{a=\"1\",le=\"+Inf\"} 2\n"
     "nothing_here_bucket{a=\"2\",le=\"1\"} 2\nnothing_here_bucket{a=\"2\",le=\"+Inf\"} 2\n",
     "different buckets"),
    ("# TYPE nothing_here histogram\nnothing_here_bucket{le=\"+Inf\"} -2\n", "not a count"),
    ("# TYPE nothing_here histogram\n" + "".join(
        f"nothing_here_bucket{{a=\"{i}\",le=\"+Inf\"}} 1\n" for i in range(1001)),
     "more than 1000 label sets"),
])
def test_what_is_not_a_usable_histogram_is_refused_in_one_line(text: str, reason: str) -> None:
    with pytest.raises(ScrapeError) as e:
        parse(text, "nothing_here")
    assert reason in str(e.value) and "\n" not in str(e.value)


# --- hostile endpoints -------------------------------------------------------------------

Answer = Callable[[socket.socket], None]


@pytest.fixture
def endpoint() -> Iterator[Callable[[Answer], int]]:
    """A local server on an ephemeral port that answers each connection with `answer`
    (in a thread of its own); returns the port."""
    servers: list[socket.socket] = []
    stop = threading.Event()

    def start(answer: Answer) -> int:
        server = socket.create_server(("127.0.0.1", 0))
        server.settimeout(0.2)
        servers.append(server)

        def accept() -> None:
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except OSError:
                    continue
                threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

        def serve_one(conn: socket.socket) -> None:
            with conn:
                try:
                    conn.recv(65536)
                    answer(conn)
                except OSError:
                    pass

        threading.Thread(target=accept, daemon=True).start()
        return server.getsockname()[1]

    yield start
    stop.set()
    for s in servers:
        s.close()


def ok(body: str) -> Answer:
    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + body.encode())
    return answer


def get(port: int, timeout: float = 1.0, limit: int = 1 << 20) -> str:
    with socket.socket() as s:
        return http_get(s, port, "/metrics", time.monotonic() + timeout, limit)


def test_a_plain_answer_is_read(endpoint: Callable[[Answer], int]) -> None:
    text = exposition(2)
    assert get(endpoint(ok(text))) == text


def slow(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
    for _ in range(100):
        conn.sendall(b"# still here\n")
        time.sleep(0.1)


def endless(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
    while True:
        conn.sendall(b"x_bucket{le=\"+Inf\"} 1\n" * 1000)


def silent(conn: socket.socket) -> None:
    time.sleep(10)


def test_a_scrape_has_a_third_of_the_shortest_window_at_most_3_s() -> None:
    assert timeout_for(4.0) == pytest.approx(4.0 / 3)
    assert timeout_for(10.0) == 3.0  # the daemon's default window
    assert timeout_for(2.0) + 1.0 < 2.0  # kicked that and a tick before: ends within it


@pytest.mark.parametrize(("answer", "reason"), [
    (slow, "no whole answer within"),
    (silent, "no whole answer within"),
    # (on a loaded host the deadline may come first: either way, one scrape lost)
    (endless, "answer larger than|no whole answer within"),
    (ok("x" * (2 << 20)), "answer larger than|no whole answer within"),
    (lambda c: c.sendall(b"SSH-2.0-OpenSSH\r\n\r\n"), "not an HTTP answer"),
    (lambda c: c.sendall(b"garbage with no end of headers"), "not an HTTP answer"),
    (lambda c: c.sendall(b"HTTP/1.0 404 Not Found\r\n\r\n"), "HTTP/1.0 404"),
    (lambda c: c.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n"),
     "an encoded answer"),
    (lambda c: c.sendall(b"HTTP/1.0 200 OK\r\n\r\n\xff\xfe"), "not UTF-8"),
])
def test_a_hostile_endpoint_costs_one_scrape_of_at_most_the_timeout(
        endpoint: Callable[[Answer], int], answer: Answer, reason: str) -> None:
    port = endpoint(answer)
    with pytest.raises(ScrapeError, match=reason) as e:
        get(port)
    assert "\n" not in str(e.value)


def test_nothing_listening_is_a_failed_scrape() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    with pytest.raises(ScrapeError, match="refused"):
        get(port)


# --- the network namespace ---------------------------------------------------------------


def own_cgroup(tmp_path: Path, pids: str) -> tuple[Path, Path]:
    """A stand-in cgroup mount where this process's cgroup v2 path is a directory whose
    cgroup.procs lists `pids`: (cgroup, mount)."""
    line = next(x for x in Path("/proc/self/cgroup").read_text().splitlines()
                if x.startswith("0::/"))
    mount = tmp_path / "mount"
    cgroup = mount / line[4:].lstrip("/")
    cgroup.mkdir(parents=True)
    (cgroup / "cgroup.procs").write_text(pids)
    return cgroup, mount


@pytest.mark.skipif(os.geteuid() != 0, reason="entering a network namespace needs root")
def test_the_socket_is_made_in_the_netns_of_a_process_of_the_cgroup(
        tmp_path: Path, endpoint: Callable[[Answer], int]) -> None:
    cgroup, mount = own_cgroup(tmp_path, f"{os.getpid()}\n")
    with socket_in_netns(cgroup, mount) as s:  # this process's own: a server here answers
        text = exposition(1)
        assert http_get(s, endpoint(ok(text)), "/metrics", time.monotonic() + 1) == text


def test_a_process_of_another_cgroup_is_not_entered(tmp_path: Path) -> None:
    cgroup, mount = own_cgroup(tmp_path, "")
    other = mount / "other"
    other.mkdir()
    (other / "cgroup.procs").write_text(f"{os.getpid()}\n")  # listed, but not in it
    with pytest.raises(ScrapeError, match="not in its cgroup"):
        socket_in_netns(other, mount)
    (cgroup / "cgroup.procs").write_text("")
    with pytest.raises(ScrapeError, match="no process in its cgroup"):
        socket_in_netns(cgroup, mount)


def test_the_processes_of_a_delegated_container_are_looked_for_in_cruns_subgroup(
        tmp_path: Path) -> None:
    _, mount = own_cgroup(tmp_path, "")
    scope = mount / "machine.slice" / "libpod-a.scope"
    (scope / CRUN_SUBGROUP).mkdir(parents=True)
    (scope / "cgroup.procs").write_text("")
    (scope / CRUN_SUBGROUP / "cgroup.procs").write_text(f"{os.getpid()}\n")
    # listed there (this process is in neither: it is checked against the subgroup)
    with pytest.raises(ScrapeError, match="not in its cgroup"):
        socket_in_netns(scope, mount)


def test_a_planted_symlink_is_not_followed(tmp_path: Path) -> None:
    cgroup, mount = own_cgroup(tmp_path, "")
    (cgroup / "cgroup.procs").unlink()
    (tmp_path / "elsewhere").write_text(f"{os.getpid()}\n")
    (cgroup / "cgroup.procs").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ScrapeError, match="cannot list its processes"):
        socket_in_netns(cgroup, mount)


# --- the scraper -------------------------------------------------------------------------


class Service:
    """A service's histogram, served at a local port; `restart` starts its counts over."""

    def __init__(self, endpoint: Callable[[Answer], int]) -> None:
        self.registry = CollectorRegistry()
        self.h = Histogram("lat", "latency", registry=self.registry)
        self.port = endpoint(lambda c: ok(generate_latest(self.registry).decode())(c))

    def restart(self) -> None:
        self.registry.unregister(self.h)
        self.h = Histogram("lat", "latency", registry=self.registry)


def test_the_scraper_hands_each_window_once_and_starts_over_after_a_restart(
        endpoint: Callable[[Answer], int]) -> None:
    svc = Service(endpoint)
    scraper = Scraper(None)
    job = Job("svc", "/none", Scrape(f":{svc.port}/metrics", "lat"), "mean")
    broken = Job("broken", "/none", Scrape(":1/metrics", "lat"), "mean")
    scraper.assign([(2, job), (0, broken)])
    count, stats = np.zeros(3, np.int64), np.full((len(STATS), 3), np.nan)

    def scraped_round() -> None:
        rounds = scraper.rounds
        scraper.kick()
        wait_for(lambda: scraper.rounds > rounds, 30, "a round", every=0.05)

    def window_of() -> tuple[int, float]:
        scraper.fill(count, stats)
        return int(count[2]), float(stats[MEAN, 2])

    try:
        scraped_round()  # the first reading: where the first window starts
        assert window_of() == (0, pytest.approx(np.nan, nan_ok=True))
        for _ in range(10):
            svc.h.observe(0.2)
        scraped_round()
        assert window_of() == (10, pytest.approx(0.2))
        assert "refused" in scraper.errors["broken"] and count[0] == 0
        assert scraper.error_s["svc"] == 0  # a mean is exact
        assert window_of()[0] == 0  # taken once
        svc.restart()
        svc.h.observe(0.3)
        scraped_round()  # fewer than before: it starts over, no false reading
        assert window_of()[0] == 0
        for _ in range(4):
            svc.h.observe(0.4)
        scraped_round()
        assert window_of() == (4, pytest.approx(0.4))
    finally:
        scraper.close()


def test_a_scrape_without_a_netns_reads_the_histogram(endpoint: Callable[[Answer], int]
                                                      ) -> None:
    svc = Service(endpoint)
    svc.h.observe(0.5)
    r = scrape(Job("svc", "/none", Scrape(f":{svc.port}/metrics", "lat"), "p95"), None)
    assert r.count == 1 and r.sum == 0.5
