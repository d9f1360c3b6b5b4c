"""python3 -m bench.cli: the wall time of dqoesctl, this checkout's against an older one's.

    python3 -m bench.cli [--base REV] [--runs N]

Each command runs N times as a fresh `python3 -m dqoes_cg.ctl` (what a user waits for: the
interpreter's start, the imports, the request), alternating between the two trees, against
a stub daemon and manager (lab/stubdaemon.py) that answer at once. REV's dqoes_cg is taken
with `git archive` into a temporary directory (default: eea5ca0, the CLI that imported
numpy). Prints the median and the 10th-90th percentiles of each, and new/old.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab.stubdaemon import StubDaemon

ROOT = Path(__file__).resolve().parents[1]
NATIVE = "dqoes_cg/_native.abi3.so"  # built, not tracked: the old tree gets ours


def _old_tree(rev: str, into: Path) -> None:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "dqoes_cg"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    if (ROOT / NATIVE).exists():
        shutil.copy2(ROOT / NATIVE, into / NATIVE)


def _time(tree: Path, args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dqoes_cg.ctl", *args], cwd=tree, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def _summary(times: list[float]) -> str:
    deciles = statistics.quantiles(times, n=10)
    return (f"{statistics.median(times) * 1e3:6.1f} ms "
            f"({deciles[0] * 1e3:.0f}-{deciles[-1] * 1e3:.0f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="eea5ca0", help="the older tree's git revision")
    p.add_argument("--runs", type=int, default=30)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old, run = Path(tmp) / "old", Path(tmp) / "run"
        old.mkdir()
        run.mkdir()
        _old_tree(args.base, old)
        sock, manager = run / "dqoes.sock", run / "manager.sock"
        commands = {
            "--version": ["--version"],
            "status": ["--socket", str(sock), "status"],
            "list": ["--socket", str(sock), "list"],
            "set-target": ["--socket", str(sock), "set-target", "web", "40ms"],
            "cluster status": ["cluster", "status", "--manager-socket", str(manager)],
        }
        print(f"dqoesctl, median of {args.runs} runs (10th-90th percentile), "
              f"{sys.executable} {sys.version.split()[0]}")
        print(f"{'command':16} {'this tree':>24} {args.base:>24}  new/old")
        with StubDaemon(sock), StubDaemon(manager):
            for name, cmd in commands.items():
                new_times, old_times = [], []
                for _ in range(args.runs):  # alternating: a load that comes and goes hits both
                    new_times.append(_time(ROOT, cmd))
                    old_times.append(_time(old, cmd))
                ratio = statistics.median(new_times) / statistics.median(old_times)
                print(f"{name:16} {_summary(new_times):>24} {_summary(old_times):>24}"
                      f"  {ratio:.2f}")


if __name__ == "__main__":
    main()
