"""Prometheus metrics: the exposition (checked by promtool), the HTTP server, and dqoesd
serving them over a fake cgroup tree."""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import math
import select
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from dqoes_cg.metrics import (
    MAX_CONNECTIONS,
    REQUEST_DEADLINE_S,
    SNAPSHOT_MAX_AGE_S,
    MetricsServer,
    parse_listen,
    render,
)
from dqoes_cg.status import Status
from lab.fakecg import make_cgroup

PROMTOOL = shutil.which("promtool")


def _container(name: str, cls: str, **values: Any) -> dict[str, Any]:
    row = {"name": name, "class": cls, "target_s": 0.04, "metric": "p95", "measured_s": None,
           "q_s": None, "cpu_limit_cores": None, "cpu_usage_cores": 0.0,
           "throttled_ratio": 0.0, "samples": 0, "cgroup": None, "ring": "/run/dqoes/x"}
    return {**row, **values}


STATUS_JSON = {
    "host": {"G": 1, "S": 1, "B": 0, "idle": 1, "pending": 1, "policy": "dqoes",
             "interval_s": 20.0, "last_decision_age_s": 3.0, "last_decision_unix": 1.7e9,
             "budget_cpus": 2.0, "ticks": 120, "decisions": 7, "reconcile_corrections": 2,
             "ring_faults": 0, "ring_lost": 5, "totals": {}, "systemd_sent": 3,
             "systemd_failed": 1},
    "containers": [
        _container("face-unlock", "G", measured_s=0.031, q_s=0.009, cpu_limit_cores=0.75,
                   cpu_usage_cores=0.7, throttled_ratio=0.25, samples=40),
        _container('odd "name" \\ here', "S", measured_s=0.04, cpu_limit_cores=1.2),
        _container("sleepy", "idle"),
        _container("later", "pending"),
    ],
}
STATUS = Status.from_json(STATUS_JSON)


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition, as prometheus_client's own parser reads it."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


def _text(status: Status, accept: str = "") -> str:
    return render(status, accept)[0].decode()


def test_render_per_container_and_per_host() -> None:
    samples = _samples(_text(STATUS))
    for (name, labels), value in (
        (_key("dqoes_container_target_seconds", container="face-unlock", metric="p95"), 0.04),
        (_key("dqoes_container_latency_seconds", container="face-unlock", metric="p95"),
         0.031),
        (_key("dqoes_container_class", container="face-unlock", **{"class": "G"}), 1),
        (_key("dqoes_container_class", container="face-unlock", **{"class": "B"}), 0),
        (_key("dqoes_container_cpu_limit_cores", container="face-unlock"), 0.75),
        (_key("dqoes_container_cpu_usage_cores", container="face-unlock"), 0.7),
        (_key("dqoes_container_throttled_ratio", container="face-unlock"), 0.25),
        (_key("dqoes_container_cpu_limit_cores", container='odd "name" \\ here'), 1.2),
        (_key("dqoes_container_cpu_limit_cores", container="sleepy"), math.inf),
        (_key("dqoes_container_class", container="later", **{"class": "pending"}), 1),
        (_key("dqoes_containers", **{"class": "S"}), 1),
        (_key("dqoes_ticks_total"), 120),
        (_key("dqoes_reconcile_corrections_total"), 2),
        (_key("dqoes_ring_faults_total"), 0),
        (_key("dqoes_systemd_updates_total", result="failed"), 1),
        (_key("dqoes_last_decision_timestamp_seconds"), 1.7e9),
    ):
        assert samples[name, labels] == value, (name, labels)
    assert math.isnan(samples[_key("dqoes_container_latency_seconds", container="sleepy",
                                   metric="p95")])
    # A pending container has a target and a class, nothing measured.
    assert _key("dqoes_container_cpu_usage_cores", container="later") not in samples


def test_openmetrics_when_asked_and_any_name_renders() -> None:
    weird = Status.from_json({**STATUS_JSON, "containers": [
        _container("bad\udcffname\nline", "S", measured_s=0.04)]})
    body, content_type = render(weird, "application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    families = {f.name: f for f in openmetrics_families(body.decode())}
    assert families["dqoes_ticks"].samples[0].value == 120
    [name] = {s.labels["container"] for s in families["dqoes_container_class"].samples}
    assert name == "bad\\udcffname\nline"  # the lone surrogate, spelled out


def _promtool_check(text: str) -> None:
    if PROMTOOL is None:
        pytest.skip("promtool missing: install Debian's prometheus (lab/guest/install-deps)")
    result = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(),
                            capture_output=True, timeout=60)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert not result.stdout.strip(), result.stdout.decode()  # no lint warnings either


def test_promtool_finds_the_exposition_clean() -> None:
    _promtool_check(_text(STATUS))


def test_promtool_finds_an_empty_controller_clean() -> None:
    host = {**STATUS_JSON["host"], "G": 0, "S": 0, "idle": 0, "pending": 0,
            "last_decision_unix": None}
    _promtool_check(_text(Status.from_json({"host": host, "containers": []})))


def test_recommending_carries_the_limit_it_would_set_and_the_class_expected() -> None:
    doc = {"host": {**STATUS_JSON["host"], "acting": False}, "containers": [
        _container("web", "B", measured_s=0.06, cpu_limit_cores=0.5,
                   recommended_limit_cores=0.8, expected_class="S")]}
    text = _text(Status.from_json(doc))
    samples = _samples(text)
    assert samples[_key("dqoes_container_recommended_cpu_limit_cores", container="web")] == 0.8
    assert samples[_key("dqoes_container_expected_class", container="web",
                        **{"class": "S"})] == 1
    assert samples[_key("dqoes_acting")] == 0
    assert _key("dqoes_container_recommended_cpu_limit_cores", container="web") not in \
        _samples(_text(STATUS))  # acting: nothing recommended
    if PROMTOOL is not None:
        _promtool_check(text)


@pytest.mark.parametrize(("text", "address"), [
    ("9750", ("127.0.0.1", 9750)), ("0.0.0.0:9750", ("0.0.0.0", 9750)),
    ("[::1]:9750", ("::1", 9750)), ("localhost:80", ("localhost", 80)),
])
def test_parse_listen(text: str, address: tuple[str, int]) -> None:
    assert parse_listen(text) == address


@pytest.mark.parametrize("text", ["", "x", ":9750", "1.2.3.4:", "1.2.3.4:0", "h:65536",
                                  "h:-1", "h:9750x"])
def test_parse_listen_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="bad metrics address"):
        parse_listen(text)


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def test_server_answers_metrics_only_and_survives_a_failed_snapshot() -> None:
    snapshots = [STATUS, {}, STATUS]  # the second is broken: a 500, then service goes on
    clock = itertools.count(0, SNAPSHOT_MAX_AGE_S)  # a new snapshot for every scrape
    server = MetricsServer(("127.0.0.1", 0), lambda: snapshots.pop(0),
                           clock=lambda: next(clock))
    try:
        base = f"http://127.0.0.1:{server.address[1]}"
        status, content_type, body = _get(base + "/metrics")
        assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
        assert body == _text(STATUS)
        assert _get(base + "/metrics")[0] == 500
        assert _get(base + "/")[0] == 404
        assert _get(base + "/metrics?x=1")[0] == 200
    finally:
        server.close()


def test_close_when_a_client_ended_the_thread_first(server: MetricsServer) -> None:
    """The race of close(): a client wakes the thread between close() marking it closing and
    waking it, and the thread ends first. close() still returns, and twice."""
    server._closing = True
    socket.create_connection(server.address, timeout=30).close()
    server._thread.join(timeout=60)
    assert not server._thread.is_alive()
    server.close()
    server.close()


def test_scrapes_take_one_snapshot_a_second_at_most() -> None:
    """However many scrapes come, in whatever formats, the daemon's lock is taken for a
    snapshot once per SNAPSHOT_MAX_AGE_S."""
    taken = []
    now = [0.0]

    def snapshot() -> Status:
        taken.append(now[0])
        return STATUS

    server = MetricsServer(("127.0.0.1", 0), snapshot, clock=lambda: now[0])
    try:
        url = f"http://127.0.0.1:{server.address[1]}/metrics"
        openmetrics = urllib.request.Request(
            url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        for _ in range(5):
            assert _get(url)[0] == 200
            with urllib.request.urlopen(openmetrics, timeout=30) as reply:
                assert reply.headers["Content-Type"].startswith("application/openmetrics")
        now[0] += SNAPSHOT_MAX_AGE_S
        assert _get(url)[0] == 200
        assert taken == [0.0, SNAPSHOT_MAX_AGE_S]
    finally:
        server.close()


def test_a_busy_loop_is_answered_from_the_last_snapshot() -> None:
    """While a long tick holds the loop's lock, the snapshot gives up (None): the scrape is
    answered from the last one, or with 503 before there is any."""
    answers: list[Status | None] = [None, STATUS, None]
    clock = itertools.count(0, SNAPSHOT_MAX_AGE_S)
    server = MetricsServer(("127.0.0.1", 0), lambda: answers.pop(0), clock=lambda: next(clock))
    try:
        url = f"http://127.0.0.1:{server.address[1]}/metrics"
        assert _get(url)[0] == 503
        assert _get(url)[0] == 200
        status, _, body = _get(url)
        assert status == 200 and body == _text(STATUS)
    finally:
        server.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dqoesd_serves_metrics(tmp_path: Path) -> None:
    mount = tmp_path / "cgroup"
    make_cgroup(mount, "app/web")
    port = _free_port()
    daemon = subprocess.Popen(
        [sys.executable, "-m", "dqoes_cg.daemon", "--cgroup-mount", str(mount),
         "--state-dir", str(tmp_path / "state"), "--run-dir", str(tmp_path / "run"),
         "--sample-interval", "0.1", "--cpus", "2", "--metrics-listen", str(port)],
        stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status, _, body = _get(f"http://127.0.0.1:{port}/metrics")
                break
            except OSError:
                assert daemon.poll() is None, daemon.stderr.read().decode()  # type: ignore
                assert time.monotonic() < deadline, "no metrics within 30 s"
                time.sleep(0.1)
        assert status == 200 and "dqoes_ticks_total" in body
        if PROMTOOL is not None:
            _promtool_check(body)
    finally:
        daemon.terminate()
        assert daemon.wait(30) == 0


def test_dqoesd_refuses_a_bad_metrics_address(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "dqoes_cg.daemon", "--metrics-listen",
                             "nowhere:port"], capture_output=True, timeout=60)
    assert result.returncode == 2
    assert "bad metrics address 'nowhere:port'" in result.stderr.decode()


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    s = MetricsServer(("127.0.0.1", 0), lambda: STATUS)
    yield s
    s.close()


def _wait(condition: Callable[[], bool], what: str, deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _scrapes(port: int, n: int) -> list[int]:
    """n scrapes at once, each allowed 30 s: their HTTP statuses."""
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: _get(f"http://127.0.0.1:{port}/metrics")[0], range(n)))


def test_slow_and_idle_clients_cost_only_their_own_connections(server: MetricsServer) -> None:
    """A client dripping a byte at a time is cut at its request's deadline, however often
    it sends; 500 idle connections from the scrapers' own address (issue 33's attack) leave
    every scrape answered (one request at a time with a timeout per read answered none)."""
    port = server.address[1]
    dripper = socket.create_connection(("127.0.0.1", port))
    cut = threading.Event()

    def drip() -> None:
        try:
            while dripper.send(b"G") and not select.select([dripper], [], [], 0.5)[0]:
                pass
        except OSError:
            pass
        cut.set()

    threading.Thread(target=drip, daemon=True).start()
    idle = []
    for _ in range(500):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        idle.append(s)
    try:
        assert _scrapes(port, 4) == [200] * 4
        assert cut.wait(REQUEST_DEADLINE_S * 12), "the dripping client was never cut"
        _wait(lambda: server.connections() <= MAX_CONNECTIONS, "connections not bounded")
    finally:
        dripper.close()
        for s in idle:
            s.close()


def test_hang_ups_write_one_short_line_at_most(
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    """Clients that ask and hang up before reading a large reply (some with a reset) leave
    no traceback, and one log line at most."""
    many = Status.from_json({**STATUS_JSON, "containers": [
        _container(f"c{i}", "S", measured_s=0.04, cpu_limit_cores=0.5) for i in range(3000)]})
    server = MetricsServer(("127.0.0.1", 0), lambda: many)
    caplog.set_level(logging.DEBUG, logger="dqoes_cg.metrics")
    try:
        for i in range(40):
            with socket.create_connection(("127.0.0.1", server.address[1])) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                if i % 2:  # a reset rather than a close
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        assert _get(f"http://127.0.0.1:{server.address[1]}/metrics")[0] == 200
        _wait(lambda: server.connections() == 0, "hung-up connections left open")
    finally:
        server.close()
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err + caplog.text
    lines = [r for r in caplog.records if r.name == "dqoes_cg.metrics"]
    assert len(lines) <= 1 and all("\n" not in r.getMessage() for r in lines), caplog.text


@pytest.mark.parametrize("accept", [
    "application/openmetrics-text; version=abc", "text/plain; version=x.y", ";;;,,,",
    "text/plain; version=99999999999999999999.0", "\x00\xff" * 100, "a" * 6000])
def test_any_accept_header_gets_an_exposition_and_no_log_line(
        server: MetricsServer, caplog: pytest.LogCaptureFixture, accept: str) -> None:
    with socket.create_connection(("127.0.0.1", server.address[1]), timeout=30) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nAccept: " + accept.encode("latin-1")
                  + b"\r\n\r\n")
        assert b" 200 " in s.makefile("rb").readline()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_huge_or_malformed_request_is_refused(server: MetricsServer) -> None:
    for request, status in ((b"GET /metrics HTTP/1.1\r\nX: " + b"x" * 10_000, b" 431 "),
                            (b"NONSENSE\r\n\r\n", b" 400 "),
                            (b"POST /metrics HTTP/1.1\r\n\r\n", b" 405 ")):
        with socket.create_connection(("127.0.0.1", server.address[1]), timeout=30) as s:
            s.sendall(request)
            assert status in s.makefile("rb").readline(), request[:20]
