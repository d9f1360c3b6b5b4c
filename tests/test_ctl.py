"""dqoesctl against a running dqoesd: every request, and every bad one.

The daemon runs for real (its own process, socket, state file), over a fake cgroup tree:
these tests are about the interface, its errors and its persistence. What the daemon does
to a real kernel is tested in test_daemon_kernel.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dqoes_cg import ctl
from dqoes_cg.ctl import format_duration, parse_duration
from lab.fakecg import make_cgroup
from lab.stubdaemon import StubDaemon


@pytest.mark.parametrize(("text", "seconds"), [
    ("40ms", 0.04), ("1.5s", 1.5), ("250us", 250e-6), ("250µs", 250e-6), (" 2 s ", 2.0),
    (".5ms", 0.0005), ("1us", 1e-6), ("0.6us", 1e-6 * 0.6),
])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "40", "ms", "-5ms", "0ms", "1e3ms", "5 min", "nan s",
                                  "40msx", "4,5s", "\u0664\u0660ms", "\uff14\u0660ms",
                                  "\U0001d7d2\U0001d7ce ms", "40\u2003ms",
                                  "0.000001us", "0.5us",
                                  pytest.param("9" * 400 + "s", id="overflow")])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format_duration() -> None:
    assert format_duration(0.04) == "40.0ms"
    assert format_duration(2.5) == "2.50s"
    assert format_duration(0.00025) == "250us"
    assert format_duration(None) == "-"


class Daemon:
    def __init__(self, tmp: Path, run: Path | None = None) -> None:
        self.mount = tmp / "cgroup"
        self.state = tmp / "state"
        self.run = run or tmp / "run"
        self.socket = self.run / "dqoes.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dqoes_cg.daemon", "--cgroup-mount", str(self.mount),
             "--state-dir", str(self.state), "--run-dir", str(self.run),
             "--sample-interval", "0.2", "--cpus", "2", "--ring-capacity", "1024", *extra],
            stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while not self._answers():
            assert self.proc.poll() is None, self.proc.stderr.read().decode()  # type: ignore
            assert time.monotonic() < deadline, "daemon did not start"
            time.sleep(0.05)

    def _answers(self) -> bool:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(self.socket))
            except OSError:  # not there yet, or a stale socket of a killed daemon
                return False
        return True

    def stop(self, sig: int = signal.SIGTERM) -> str:
        assert self.proc is not None
        self.proc.send_signal(sig)
        _, err = self.proc.communicate(timeout=20)
        self.proc = None
        return err.decode()

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dqoes_cg.ctl", "--socket", str(self.socket), *args],
            capture_output=True, text=True, timeout=30)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path)
    make_cgroup(d.mount, "pods/web", cpu_max="50000 100000\n")
    make_cgroup(d.mount, "pods/batch")
    d.start()
    yield d
    if d.proc is not None:
        d.stop(signal.SIGKILL)


def _state(d: Daemon) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(d.state.glob("state.*")))


def test_set_list_status_unset(daemon: Daemon) -> None:
    r = daemon.ctl("set-target", "pods/web", "40ms", "--metric", "p99")
    assert r.returncode == 0, r.stderr
    assert "bound to " + str(daemon.mount / "pods/web") in r.stdout
    assert "docker run -v" in r.stdout
    listed = json.loads(daemon.ctl("list", "--json").stdout)
    assert [(t["name"], t["target_s"], t["metric"], t["state"]) for t in listed] == [
        ("pods/web", 0.04, "p99", "bound")]
    assert Path(listed[0]["ring"]).is_file()

    status = json.loads(daemon.ctl("status", "--json").stdout)
    assert status["host"]["budget_cpus"] == 2
    (row,) = status["containers"]
    assert row["name"] == "pods/web"
    assert row["class"] == "idle"  # no requests recorded
    assert row["cpu_limit_cores"] == 0.5  # untouched: what the cgroup had
    table = daemon.ctl("status").stdout
    assert "pods/web" in table and "CLASS" in table

    r = daemon.ctl("unset-target", "pods/web")
    assert r.returncode == 0, r.stderr
    assert json.loads(daemon.ctl("list", "--json").stdout) == []
    assert not Path(listed[0]["ring"]).exists()


def test_a_target_measured_by_the_service_s_own_histogram(daemon: Daemon) -> None:
    r = daemon.ctl("set-target", "pods/web", "40ms", "--metrics", ":8000/metrics",
                   "--histogram", "request_latency_seconds")
    assert r.returncode == 0, r.stderr
    assert "latency from :8000/metrics (request_latency_seconds)" in r.stdout
    (listed,) = json.loads(daemon.ctl("list", "--json").stdout)
    assert (listed["metrics"], listed["histogram"]) == (":8000/metrics",
                                                        "request_latency_seconds")

    def scraped() -> dict[str, object] | None:  # its fake cgroup has no process to enter
        (row,) = json.loads(daemon.ctl("status", "--json").stdout)["containers"]
        return row if row["scrape_error"] else None

    deadline = time.monotonic() + 60
    while (row := scraped()) is None:
        assert time.monotonic() < deadline, "no scrape in 60 s"
        time.sleep(0.2)
    assert row["class"] == "idle" and row["metrics"] == ":8000/metrics"
    table = daemon.ctl("status").stdout
    assert ":8000/metrics request_latency_seconds" in table
    assert f"pods/web: scrape of :8000/metrics failed: {row['scrape_error']}" in table


def test_pending_target_binds_when_the_cgroup_appears(daemon: Daemon) -> None:
    r = daemon.ctl("set-target", "pods/later", "1s", "--pending")
    assert r.returncode == 0, r.stderr
    assert "pending" in r.stdout
    make_cgroup(daemon.mount, "pods/later")
    deadline = time.monotonic() + 15
    while json.loads(daemon.ctl("list", "--json").stdout)[0]["state"] != "bound":
        assert time.monotonic() < deadline, "pending target never bound"
        time.sleep(0.2)


@pytest.mark.parametrize(("args", "message"), [
    (("set-target", "pods/nothing", "40ms"), "no cgroup"),
    (("set-target", "pods/web", "40"), "unit"),
    (("set-target", "pods/web", "0ms"), "at least 1us"),
    (("set-target", "pods/web", "--", "-3ms"), "bad duration"),
    (("set-target", "pods/web", "2h"), "bad duration"),
    (("set-target", "pods/web", "5000s"), "at most"),
    (("set-target", "pods/web", "40ms", "--metric", "p42"), "invalid choice"),
    (("set-target", "pods/web", "40ms", "--metrics", ":8000/metrics"), "go together"),
    (("set-target", "pods/web", "40ms", "--metrics", "8000", "--histogram", "h"),
     "is not :port/path"),
    (("set-target", "pods/web", "--training", "--metrics", ":1/m", "--histogram", "h"),
     "no target, metric or histogram"),
    (("unset-target", "pods/web"), "no target"),
    (("status", "pods/web"), "no target"),
    (("frobnicate",), "invalid choice"),
])
def test_bad_requests_change_nothing(daemon: Daemon, args: tuple[str, ...],
                                     message: str) -> None:
    assert daemon.ctl("set-target", "pods/batch", "2s").returncode == 0
    before = _state(daemon)
    r = daemon.ctl(*args)
    assert r.returncode != 0
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("dqoesctl: ")
    assert message in r.stderr.lower()
    assert _state(daemon) == before


def test_protocol_errors(daemon: Daemon) -> None:
    def raw(payload: bytes) -> dict[str, object]:
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(daemon.socket))
        s.sendall(payload)
        reply = json.loads(s.makefile().readline())
        s.close()
        return reply

    assert "not valid JSON" in raw(b"{nope\n")["error"]
    assert "version" in raw(b'{"version": 99, "op": "list"}\n')["error"]
    assert "unknown operation" in raw(b'{"version": 1, "op": "rm -rf"}\n')["error"]
    assert "object" in raw(b"[1, 2]\n")["error"]
    bad = raw(b'{"version": 1, "op": "set-target", "container": "pods/web", '
              b'"target_s": "fast", "metric": "p95"}\n')
    assert "number" in bad["error"]
    assert raw(b'{"version": 1, "op": "list"}\n') == {"version": 1, "ok": True, "result": []}


def test_daemon_not_running(tmp_path: Path) -> None:
    d = Daemon(tmp_path)
    r = d.ctl("list")
    assert r.returncode == 3
    assert r.stderr.strip() == f"dqoesctl: daemon not running (no socket at {d.socket})"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
@pytest.mark.parametrize("public", [True, False])
def test_permission_denied(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                           public: bool) -> None:
    run = Path(tempfile.mkdtemp(prefix="dqoes-perm-"))  # reachable by an unprivileged user
    os.chmod(run, 0o755)
    d = Daemon(tmp_path, run=run)
    make_cgroup(d.mount, "pods/web")
    d.start(*(["--public-status"] if public else []))
    sock = ["--socket", str(d.socket)]
    try:
        os.seteuid(65534)  # SO_PEERCRED reports the euid at connect()
        try:
            listed = ctl.main([*sock, "list"])
            refused = ctl.main([*sock, "set-target", "pods/web", "40ms"])
        finally:
            os.seteuid(0)
        _, err = capsys.readouterr()
        assert refused == 1
        if public:
            assert listed == 0
            assert err == "dqoesctl: permission denied: set-target needs root\n"
        else:
            assert listed == 1
            assert err.splitlines() == [f"dqoesctl: permission denied: cannot connect to "
                                        f"{d.socket}"] * 2
        assert json.loads(d.ctl("list", "--json").stdout) == []
    finally:
        d.stop()
        shutil.rmtree(run, ignore_errors=True)


def test_targets_survive_a_crash_and_a_clean_stop(daemon: Daemon) -> None:
    assert daemon.ctl("set-target", "pods/web", "40ms").returncode == 0
    assert daemon.ctl("set-target", "pods/ghost", "1s", "--pending").returncode == 0
    daemon.stop(signal.SIGKILL)
    daemon.start()
    listed = {t["name"]: t for t in json.loads(daemon.ctl("list", "--json").stdout)}
    assert listed["pods/web"]["state"] == "bound"
    assert listed["pods/ghost"]["state"] == "pending"
    err = daemon.stop()
    assert "stopped" in err
    daemon.start()
    assert len(json.loads(daemon.ctl("list", "--json").stdout)) == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_control_group_may_change_targets(tmp_path: Path) -> None:
    run = Path(tempfile.mkdtemp(prefix="dqoes-group-"))
    os.chmod(run, 0o755)
    d = Daemon(tmp_path, run=run)
    make_cgroup(d.mount, "pods/web")
    d.start("--group", "nogroup")
    try:
        os.setegid(65534)
        os.seteuid(65534)
        try:
            allowed = ctl.main(["--socket", str(d.socket), "set-target", "pods/web", "40ms"])
        finally:
            os.seteuid(0)
            os.setegid(0)
        assert allowed == 0
        assert [t["name"] for t in json.loads(d.ctl("list", "--json").stdout)] == ["pods/web"]
    finally:
        d.stop()
        shutil.rmtree(run, ignore_errors=True)


def test_sd_notify_ready_status_watchdog(tmp_path: Path) -> None:
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(30)
    d = Daemon(tmp_path)
    make_cgroup(d.mount, "pods/web")
    os.environ["NOTIFY_SOCKET"] = str(tmp_path / "notify")
    try:
        d.start()
    finally:
        del os.environ["NOTIFY_SOCKET"]
    try:
        seen: set[str] = set()
        while not {"READY=1", "WATCHDOG=1"} <= seen:
            seen.update(notify.recv(4096).decode().splitlines())
        assert any(line.startswith("STATUS=0 bound") for line in seen), seen
    finally:
        d.stop()
        notify.close()


def test_the_cli_imports_no_numpy(tmp_path: Path) -> None:
    """status, list, set-target and cluster status, against a stub daemon and manager, in a
    fresh interpreter: numpy (a tenth of a second or more to import) is never loaded."""
    sock, manager = tmp_path / "dqoes.sock", tmp_path / "manager.sock"
    commands = [["status"], ["status", "--json"], ["list"], ["set-target", "web", "40ms"],
                ["cluster", "status", "--manager-socket", str(manager)]]
    script = (
        "import sys\n"
        "from dqoes_cg import ctl\n"
        f"for args in {commands!r}:\n"
        f"    assert ctl.main(['--socket', {str(sock)!r}, *args]) == 0, args\n"
        "heavy = sorted({'numpy', 'cffi', 'dqoes_cg._native'} & set(sys.modules))\n"
        "assert not heavy, heavy\n")
    with StubDaemon(sock), StubDaemon(manager):
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=120, cwd=Path(__file__).parents[1])
    assert run.returncode == 0, run.stderr
    assert "web" in run.stdout and "|S| 1 of 1 tasks" in run.stdout


def test_recommend_and_act_from_the_command_line(tmp_path: Path) -> None:
    d = Daemon(tmp_path)
    make_cgroup(d.mount, "pods/web", cpu_max="50000 100000\n")
    d.start("--recommend")
    try:
        assert d.ctl("set-target", "pods/web", "40ms").returncode == 0
        assert "recommend only: no limit is written" in d.ctl("status").stdout
        r = d.ctl("act")
        assert r.returncode == 0 and "acting" in r.stdout, r.stderr
        assert json.loads(d.ctl("status", "--json").stdout)["host"]["acting"] is True
        assert d.ctl("recommend").returncode == 0
        assert json.loads(d.ctl("status", "--json").stdout)["host"]["acting"] is False
    finally:
        d.stop()
