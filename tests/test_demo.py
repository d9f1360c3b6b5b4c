"""`python3 -m lab.demo` on a real cgroup v2 kernel, shortened, with its workers as
processes and as labelled Docker containers: it completes and writes its summary and plot,
and leaves nothing behind (how many targets it meets on a noisy emulated CPU is not
asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dqoes_cg.cgroup import find_cgroup2_mount
from dqoes_cg.engines.volume_driver import SPEC_FILE
from lab.images import DOCKER


def run_demo(out: Path, workers: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "lab.demo", "--out", str(out), "--duration", "12",
         "--no-redraw", "--workers", workers],
        capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "CONTAINER" in done.stdout  # the dqoesctl status table
    summary = (out / "summary.txt").read_text()
    assert "satisfied (class S): default even share" in summary
    assert (out / "demo.png").read_bytes().startswith(b"\x89PNG")
    assert (out / "demo.json").exists()
    return done.stdout


@pytest.mark.kernel
def test_demo_runs_and_writes_summary_and_plot(tmp_path: Path) -> None:
    run_demo(tmp_path / "out", "processes")
    # Nothing is left behind: the demo's cgroup subtree is gone.
    mount = find_cgroup2_mount()
    assert not list(mount.glob("dqoes-demo-*"))


@pytest.mark.guest_systemd
def test_the_demo_with_labelled_docker_containers(tmp_path: Path) -> None:
    out = run_demo(tmp_path / "out", "docker")
    labelled = [line for line in out.splitlines()
                if line.startswith("  $ docker run") and "--label dqoes.target=" in line]
    assert len(labelled) == 4, out[-3000:]
    # Nothing is left behind: containers, their volumes, the driver's spec file.
    assert not subprocess.run([DOCKER, "ps", "-aq"], capture_output=True, text=True,
                              check=True).stdout.split()
    assert not subprocess.run([DOCKER, "volume", "ls", "-q"], capture_output=True, text=True,
                              check=True).stdout.split()
    assert not SPEC_FILE.exists()
