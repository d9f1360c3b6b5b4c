"""python -m bench.experiments: the paper's experiments (section V) and our own, real and
simulated, each with every policy of dqoes_cg.policy.POLICIES side by side, with their plots
and a summary.

    python -m bench.experiments [--sim-only] [--quick] [--out DIR] [--only KEY ...]
    python -m bench.experiments --real-conditions [--quick] [--seeds N] [--first-seed K]
                                [--only KEY ...]
                                [--without curves|drift|packing|noise ...] [--jobs N]

1. Real runs on a cgroup v2 kernel with the cpu controller: this host if it has one, else a
   qemu guest booted for them (lab.guest, DIR shared writable). The worker types are
   calibrated first (latency alone and at a few quotas), then every scaled-down scenario
   (real_scenarios) runs on the default platform, then with dqoesd and each policy.
2. The simulator, calibrated by 1: the same small scenarios (its validation against the
   real runs), the paper's scenarios at the paper's scale, our own scenarios (target
   changes, a load phase, departures, a hopeless target, a dense node, multi-threaded
   workers), all of them again with measurement noise over several seeds, and a
   sensitivity sweep of DQoES's step beta and listener ceiling.
3. Plots (PNG), summary.md and summary.json in DIR (default bench/experiments/results).

--sim-only skips 1 (the simulator then uses DIR/calibration.json if there is one, and
validates against the real runs already in DIR); --only runs 1 for these real scenarios
alone and keeps the others' runs in DIR; --quick shortens every run (tests).

--real-conditions runs only the simulated scenarios (s*, x*, o*) under the conditions of a
real host (measured curves, a drifting node speed, the packing shortfall, noise) over
several seeds, and writes DIR/real-conditions.md and .json (conditions.py).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from dqoes_cg.policy import POLICIES
from lab.guest import here_or_in_guest

from . import conditions
from .analysis import matched_curves, scatter, settled_latency
from .progress import Progress
from .runs import MODES, every_mode, load_curves, save_curves, simulated
from .scenarios import (
    MODELS,
    PAPER_PARAMS,
    REAL_PARAMS,
    own_scenarios,
    paper_scenarios,
    real_scenarios,
)
from .sim import Curve, Params
from .trace import Run

RESULTS = Path(__file__).resolve().parent / "results"
REAL_WINDOW_S = 2.0  # observer windows of the real runs
SIM_WINDOW_S = 5.0  # and of the paper-scale simulations (hours of simulated time)
GUEST_TIMEOUT_S = 3 * 3600.0
# The sensitivity sweep of DQoES: the step beta and the listener's ceiling iv_max.
SWEEP_BETAS = (0.1, 0.3)
SWEEP_IV_MAX = (10.0, 20.0, 40.0, 160.0)
NOISE = 0.05  # the noise sweep: standard deviation of each window's log latency
NOISE_SEEDS = tuple(range(10))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.experiments", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--sim-only", action="store_true", help="no real runs (see above)")
    p.add_argument("--quick", action="store_true", help="short runs (tests)")
    p.add_argument("--real-part", action="store_true",
                   help="only step 1, on this kernel (what the guest runs)")
    p.add_argument("--real-conditions", action="store_true",
                   help="only the simulated scenarios under real conditions (see above)")
    p.add_argument("--seeds", type=int, default=conditions.SEEDS,
                   help="--real-conditions: how many seeds")
    p.add_argument("--first-seed", type=int, default=0,
                   help="--real-conditions: the first of them")
    p.add_argument("--only", nargs="+", metavar="KEY",
                   help="only these scenarios (of the real runs, or of --real-conditions)")
    p.add_argument("--jobs", type=int, default=conditions.JOBS,
                   help="--real-conditions: processes")
    p.add_argument("--without", nargs="+", choices=conditions.CONDITIONS, default=[],
                   help="--real-conditions: leave these conditions out")
    args = p.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.real_conditions:
        conditions.run(out, args.quick, args.seeds, args.only, args.jobs,
                       tuple(args.without), args.first_seed)
        return 0
    if args.real_part:
        run_real(out, args.quick, args.only)
        return 0
    if not args.sim_only:
        status = real_part_somewhere(out, args.quick, args.only)
        if status != 0:
            print(f"the real runs failed (exit status {status})", file=sys.stderr)
            return status
    run_simulated(out, args.quick)
    return 0


# --- 1. real -------------------------------------------------------------------------


def real_part_somewhere(out: Path, quick: bool, only: list[str] | None) -> int:
    return here_or_in_guest(lambda: run_real(out, quick, only), "the real runs",
                            "bench.experiments", ["--real-part", "--out", str(out)]
                            + ["--quick"] * quick + (["--only", *only] if only else []), out,
                            GUEST_TIMEOUT_S)


def run_real(out: Path, quick: bool, only: list[str] | None = None) -> None:
    """Step 1 for every real scenario, or for those of `only` (the others' runs kept)."""
    from . import real  # needs the compiled extension and a cgroup v2 kernel

    scenarios = [sc for sc in real_scenarios(quick) if not only or sc.key in only]
    if only and len(scenarios) != len(set(only)):
        raise SystemExit(f"--only: not a real scenario among {', '.join(only)}")
    progress = Progress(1 + len(MODES) * len(scenarios))
    real_dir = out / "real"
    if not only:
        shutil.rmtree(real_dir, ignore_errors=True)
    real_dir.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="dqoes-experiments-"))
    try:
        progress.step("calibrating the worker types")
        curves = real.calibrate(MODELS, work / "calibrate", 2.0 if quick else 8.0)
        save_curves(out / "calibration.json", curves)
        for sc in scenarios:
            # The default platform first: its even-share latencies, measured minutes
            # before the runs with dqoesd rather than predicted, make the targets (the
            # emulated CPUs' speed drifts with the host's load).
            progress.step(f"real {sc.key} (default)")
            default = real.run(sc, sc.build(curves), None, work / sc.key, REAL_WINDOW_S)
            nodes = sc.build(curves, settled_latency(default))
            default.nodes = nodes
            default.save(real_dir / f"{sc.key}-default.json")
            for policy in POLICIES:
                progress.step(f"real {sc.key} (dqoesd --policy {policy})")
                run = real.run(sc, nodes, replace(REAL_PARAMS, policy=policy), work / sc.key,
                               REAL_WINDOW_S)
                run.save(real_dir / f"{sc.key}-{policy}.json")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress.close("real runs done")


# --- 2. simulated, 3. report -----------------------------------------------------------


def run_simulated(out: Path, quick: bool) -> None:
    from . import report  # matplotlib: host side only

    measured = load_curves(out / "calibration.json")
    # The simulator takes latency = solo / share, which the calibration checks: its
    # factors at quotas scatter on a shared host more than they depart from 1.
    curves = {m: Curve(c.solo_s) for m, c in measured.items()}
    papers, owns, reals = paper_scenarios(quick), own_scenarios(quick), real_scenarios(quick)
    seeds = NOISE_SEEDS[:1] if quick else NOISE_SEEDS
    real_dir = out / "real"
    progress = Progress(len(papers) + len(owns) + 1 + len(reals) + 1)
    sim_runs: dict[str, dict[str, Run]] = {}
    sweep: dict[str, dict[tuple[float, float], Run]] = {}
    for sc in papers + owns:
        progress.step(f"simulating {sc.key}")
        nodes = sc.build(curves)
        sim_runs[sc.key] = every_mode(sc, nodes, curves, PAPER_PARAMS, SIM_WINDOW_S)
        if sc in papers:
            sweep[sc.key] = {(b, iv): simulated(sc, nodes, curves, Params(
                policy="dqoes", beta=b, iv_max=iv), sc.duration_s, SIM_WINDOW_S)
                for b in SWEEP_BETAS for iv in SWEEP_IV_MAX}
    progress.step(f"noise sweep: log-latency scatter {NOISE:g}, seeds {list(seeds)}")
    noisy = {sc.key: [every_mode(sc, sc.build(curves), curves, PAPER_PARAMS, SIM_WINDOW_S,
                                 NOISE, seed) for seed in seeds] for sc in papers + owns}
    real_runs: dict[str, dict[str, Any]] = {}
    for sc in reals:
        progress.step(f"simulating {sc.key} (against the real runs)")
        found = {mode: real_dir / f"{sc.key}-{mode}.json" for mode in MODES}
        if not all(f.exists() for f in found.values()):
            continue
        runs = {mode: Run.load(f) for mode, f in found.items()}
        nodes = runs["default"].nodes  # the targets the real runs had
        # The model at the speed the emulated CPUs had (see matched_curves), with the
        # scatter of each real run's measurements.
        local = matched_curves(curves, runs["default"])
        real_runs[sc.key] = {
            "real": runs, "curves": local,
            "sim": {mode: simulated(sc, nodes, local, None if mode == "default" else
                                    replace(REAL_PARAMS, policy=mode),
                                    sc.default_duration_s if mode == "default"
                                    else sc.duration_s, REAL_WINDOW_S, scatter(runs[mode]))
                    for mode in MODES},
            # a kernel whose speed holds still
            "quiet": every_mode(sc, nodes, local, REAL_PARAMS, REAL_WINDOW_S),
        }
    progress.step("plots and summary")
    report.write(out, measured, curves, papers + owns, sim_runs, sweep, noisy, reals,
                 real_runs, quick)
    progress.close(f"results in {out}")


if __name__ == "__main__":
    sys.exit(main())
