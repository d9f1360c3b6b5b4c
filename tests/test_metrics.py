"""Prometheus metrics: the exposition (checked by promtool), the HTTP server, and dqoesd
serving them over a fake cgroup tree."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from dqoes_cg.metrics import MetricsServer, parse_listen, render
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


def test_render_per_container_and_per_host() -> None:
    text = render(STATUS)
    lines = set(text.splitlines())
    for line in (
        'dqoes_container_target_seconds{container="face-unlock",metric="p95"} 0.04',
        'dqoes_container_latency_seconds{container="face-unlock",metric="p95"} 0.031',
        'dqoes_container_class{container="face-unlock",class="G"} 1',
        'dqoes_container_class{container="face-unlock",class="B"} 0',
        'dqoes_container_cpu_limit_cores{container="face-unlock"} 0.75',
        'dqoes_container_cpu_usage_cores{container="face-unlock"} 0.7',
        'dqoes_container_throttled_ratio{container="face-unlock"} 0.25',
        'dqoes_container_cpu_limit_cores{container="odd \\"name\\" \\\\ here"} 1.2',
        'dqoes_container_cpu_limit_cores{container="sleepy"} +Inf',
        'dqoes_container_latency_seconds{container="sleepy",metric="p95"} NaN',
        'dqoes_container_class{container="later",class="pending"} 1',
        'dqoes_containers{class="S"} 1',
        "dqoes_ticks_total 120",
        "dqoes_reconcile_corrections_total 2",
        "dqoes_ring_faults_total 0",
        'dqoes_systemd_updates_total{result="failed"} 1',
        "dqoes_last_decision_timestamp_seconds 1700000000.0",
    ):
        assert line in lines, line
    # A pending container has a target and a class, nothing measured.
    assert 'dqoes_container_cpu_usage_cores{container="later"}' not in text


def _promtool_check(text: str) -> None:
    if PROMTOOL is None:
        pytest.skip("promtool missing: install Debian's prometheus (lab/guest/install-deps)")
    result = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(),
                            capture_output=True, timeout=60)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert not result.stdout.strip(), result.stdout.decode()  # no lint warnings either


def test_promtool_finds_the_exposition_clean() -> None:
    _promtool_check(render(STATUS))


def test_promtool_finds_an_empty_controller_clean() -> None:
    host = {**STATUS_JSON["host"], "G": 0, "S": 0, "idle": 0, "pending": 0,
            "last_decision_unix": None}
    _promtool_check(render(Status.from_json({"host": host, "containers": []})))


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
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def test_server_answers_metrics_only_and_survives_a_failed_snapshot() -> None:
    snapshots = [STATUS, {}, STATUS]  # the second is broken: a 500, then service goes on
    server = MetricsServer(("127.0.0.1", 0), lambda: snapshots.pop(0))
    try:
        base = f"http://127.0.0.1:{server.address[1]}"
        status, content_type, body = _get(base + "/metrics")
        assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
        assert body == render(STATUS)
        assert _get(base + "/metrics")[0] == 500
        assert _get(base + "/")[0] == 404
        assert _get(base + "/metrics?x=1")[0] == 200
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
