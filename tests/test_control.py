"""The daemon against unprivileged peers and odd requests (dqoesd as a process, on a fake
cgroup tree): a user other than root cannot lock root out or stall the loop, malformed
requests get one-line errors, and dqoesctl and dqoesd fail in one line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dqoes_cg import __version__, ctl
from dqoes_cg.control import request
from lab.fakecg import make_cgroup
from tests.test_ctl import Daemon

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


@pytest.fixture
def public_daemon(tmp_path: Path) -> Iterator[Daemon]:
    run = Path(tempfile.mkdtemp(prefix="dqoes-ctl-"))  # reachable by an unprivileged user
    os.chmod(run, 0o755)
    d = Daemon(tmp_path, run=run)
    make_cgroup(d.mount, "pods/web")
    d.start("--public-status")
    yield d
    if d.proc is not None:
        d.stop(signal.SIGKILL)
    subprocess.run(["rm", "-rf", str(run)], check=False)


def _hog(d: Daemon, count: int, ask: bool) -> int:
    """A process of user nobody that opens `count` connections and never sends a request
    (or sends one and never reads the reply), re-opening each one the daemon drops. Returns
    its pid once it holds them."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"!"
        os.close(ready_r)
        return pid
    try:  # the child: never returns
        os.close(ready_r)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        held = [_connect(d.socket, ask) for _ in range(count)]
        os.write(ready_w, b"!")
        while True:
            time.sleep(0.2)
            for k, s in enumerate(held):
                try:
                    if s is None or s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                        held[k] = _connect(d.socket, ask)
                except BlockingIOError:
                    pass
                except OSError:
                    held[k] = _connect(d.socket, ask)
    finally:
        os._exit(0)


def _connect(path: Path, ask: bool) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        s.connect(str(path))
        if ask:
            s.sendall(json.dumps({"version": 1, "op": "status"}).encode() + b"\n")
    except OSError:
        s.close()
        return None
    return s


@needs_root
@pytest.mark.parametrize("ask", [False, True], ids=["idle connections", "unread replies"])
def test_an_unprivileged_user_cannot_lock_root_out(public_daemon: Daemon, ask: bool) -> None:
    d = public_daemon
    for i in range(60):  # big status replies
        assert d.ctl("set-target", f"later-{i:03d}", "1s", "--pending").returncode == 0
    ticks = request(d.socket, "status")["host"]["ticks"]
    hog = _hog(d, 40, ask)
    try:
        answered = 0
        for _ in range(20):
            answered += len(request(d.socket, "list", timeout=30)) == 60
        assert answered == 20
        # The loop kept ticking (0.2 s sample interval) while the replies sat unread.
        deadline = time.monotonic() + 60
        while request(d.socket, "status", timeout=30)["host"]["ticks"] < ticks + 10:
            assert time.monotonic() < deadline, "the loop stopped ticking"
            time.sleep(0.2)
    finally:
        os.kill(hog, signal.SIGKILL)
        os.waitpid(hog, 0)


@pytest.mark.parametrize(("payload", "message"), [
    (b"[" * 30_000 + b"]" * 30_000 + b"\n", "JSON"),  # deeper than the parser goes
    (b'{"a": ' * 9_000 + b"1" + b"}" * 9_000 + b"\n", "JSON"),
    (b'{"version": 1, "op": ["list"]}\n', "unknown operation"),
    (b'{"version": 1, "op": {"a": 1}}\n', "unknown operation"),
    (b'{"version": 1, "op": "status", "container": ["x"]}\n', "container must be"),
    (b'{"version": [1], "op": "list"}\n', "version"),
], ids=["nested lists", "nested objects", "op a list", "op an object", "container a list",
        "version a list"])
def test_malformed_requests_get_one_line_errors(public_daemon: Daemon, payload: bytes,
                                                message: str) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(public_daemon.socket))
        s.sendall(payload)
        reply = json.loads(s.makefile().readline())
    assert reply["ok"] is False
    assert message in reply["error"] and "\n" not in reply["error"]
    assert "internal error" not in reply["error"]


def test_a_full_backlog_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dqoesd.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(0)  # never accepts
    waiting = []
    try:
        for _ in range(8):  # fill the backlog
            s = socket.socket(socket.AF_UNIX)
            s.setblocking(False)
            try:
                s.connect(str(path))
            except BlockingIOError:
                s.close()
                break
            waiting.append(s)
        assert ctl.main(["--socket", str(path), "list"]) == ctl.EXIT_UNAVAILABLE
        _, err = capsys.readouterr()
        assert err.count("\n") == 1 and "daemon busy" in err, err
    finally:
        for s in waiting:
            s.close()
        server.close()


@pytest.mark.parametrize("value", ["-1", "nan", "0", "inf", "soon"])
def test_watch_interval_is_checked_before_any_output(tmp_path: Path, value: str) -> None:
    r = subprocess.run([sys.executable, "-m", "dqoes_cg.ctl", "--socket",
                        str(tmp_path / "none.sock"), "status", "--watch", value],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "seconds" in r.stderr, r.stderr


@pytest.mark.parametrize("name", ["../../etc", "rel7/../../etc", ".."])
def test_impossible_names_are_refused_even_pending(public_daemon: Daemon, name: str) -> None:
    r = public_daemon.ctl("set-target", name, "40ms", "--pending")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert json.loads(public_daemon.ctl("list", "--json").stdout) == []


@pytest.mark.parametrize("prog", ["dqoes_cg.daemon", "dqoes_cg.ctl"])
def test_version_and_help(prog: str) -> None:
    r = subprocess.run([sys.executable, "-m", prog, "--version"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.strip().endswith(__version__)
    r = subprocess.run([sys.executable, "-m", prog, "--help"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0 and "(default: None)" not in r.stdout


def test_dqoesd_refuses_a_hierarchy_without_the_cpu_controller(tmp_path: Path) -> None:
    d = Daemon(tmp_path)
    make_cgroup(d.mount, "pods/web")
    (d.mount / "cgroup.controllers").write_text("cpuset io memory pids")  # cpu is v1's
    r = subprocess.run([sys.executable, "-m", "dqoes_cg.daemon", "--cgroup-mount",
                        str(d.mount), "--state-dir", str(d.state), "--run-dir", str(d.run)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot start: the cpu controller is not available" in lines[0]
    assert "ready" not in r.stderr


def test_one_log_line_for_one_signal(tmp_path: Path) -> None:
    d = Daemon(tmp_path)
    make_cgroup(d.mount, "pods/web")
    d.start()
    err = d.stop(signal.SIGTERM)
    assert err.count("SIGTERM: stopping") == 1, err
