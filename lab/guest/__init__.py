"""Real-kernel test harness: a throwaway qemu guest with cgroup v2 (see README.md)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from lab.cgroups import cgroup2_cpu_mount

ROOT = Path(__file__).resolve().parents[2]


def here_or_in_guest(run_here: Callable[[], None], what: str, module: str, args: list[str],
                     out: Path, timeout_s: float) -> int:
    """`run_here()` if this kernel has cgroup v2 with the cpu controller; else `python3 -m
    module args` in a guest that may write only to `out` (which should make it call
    `run_here` there). Returns an exit status."""
    if cgroup2_cpu_mount() is not None:
        run_here()
        return 0
    print(f"no cgroup v2 cpu controller on this host: {what} go to a qemu guest",
          file=sys.stderr)
    cmd = [sys.executable, "-m", "lab.guest", "--writable", str(out), "--timeout",
           str(timeout_s), "--", sys.executable, "-m", module, *args]
    return subprocess.run(cmd, cwd=ROOT, check=False).returncode
