"""`python3 -m lab.demo` on a real cgroup v2 kernel, shortened: it completes and writes
its summary and plot (how many targets it meets on a noisy emulated CPU is not asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dqoes_cg.cgroup import find_cgroup2_mount

pytestmark = pytest.mark.kernel


def test_demo_runs_and_writes_summary_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "lab.demo", "--out", str(out), "--duration", "12",
         "--no-redraw"], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "CONTAINER" in done.stdout  # the dqoesctl status table
    summary = (out / "summary.txt").read_text()
    assert "satisfied (class S): default even share" in summary
    assert (out / "demo.png").read_bytes().startswith(b"\x89PNG")
    assert (out / "demo.json").exists()
    # Nothing is left behind: the demo's cgroup subtree is gone.
    mount = find_cgroup2_mount()
    assert not list(mount.glob("dqoes-demo-*"))
