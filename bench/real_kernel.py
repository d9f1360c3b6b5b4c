"""The command line of a bench that measures the real kernel: it runs here if this kernel
has cgroup v2 with the cpu controller, else in a qemu guest (lab.guest) that writes its
results into --out."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from lab.guest import here_or_in_guest

RESULTS = Path(__file__).resolve().parent / "results"
GUEST_TIMEOUT_S = 3 * 3600.0

RunHere = Callable[[Path, float, int, bool], None]  # (out, seconds, reps, quick)


def main(module: str, doc: str, run_here: RunHere, seconds: float, quick_seconds: float,
         argv: list[str] | None = None) -> int:
    """Parses --out, --seconds (per point), --reps and --quick for `module`, then calls
    `run_here` here or in a guest."""
    p = argparse.ArgumentParser(prog=f"python3 -m {module}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--seconds", type=float, default=seconds, help="per point")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="one repetition of short points (tests)")
    args = p.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    seconds = quick_seconds if args.quick else args.seconds
    reps = 1 if args.quick else args.reps
    return here_or_in_guest(lambda: run_here(out, seconds, reps, args.quick), "the runs", module,
                            ["--out", str(out), "--seconds", str(seconds), "--reps", str(reps)]
                            + ["--quick"] * args.quick, out, GUEST_TIMEOUT_S)
