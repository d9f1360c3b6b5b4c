"""How many cpu.max writes a decision asks for at scale, with and without the actuator's dead
band, and what the band costs in |S|.

    python3 -m bench.dead_band [--quick] [--out DIR]

A node of N containers (N/5 CPUs): half back-to-back workers, half open-loop services (M/D/1
at their caps, their arrivals 20-60% of an even share), targets drawn so that most but not
all can be in S. Every window's latency
is seen through log-normal noise of 0.05 (the evaluation's) and the node's speed drifts by
about 9% with a correlation time of five windows, as on the emulated guest. admit decides
every window; the actuator writes what `moved_into` selects, with DEAD_BAND and with a band
of 0 (every changed limit) and others, from the same start, on a steady and a drifting
node. Counted after a warm-up: the limits written
per decision, and |S| (a container whose window latency is within the band, or, for an
open-loop service, at most its slow edge with its cap at most its fast edge's share). The
kernel's time for those writes follows from bench/hierarchy.py's cost of one write (guest,
with that many cgroups). Results: DIR/dead_band.md and .json (default bench/results).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from bench.experiments.sim import md1_latency
from dqoes_cg.actuator import DEAD_BAND, moved_into
from dqoes_cg.policy import Admit, Observation

NS = (1_000, 10_000)
BANDS = (0.0, 0.01, DEAD_BAND, 0.05)
ALPHA = 0.10
NOISE = 0.05
DRIFT, DRIFT_WINDOWS = 0.09, 5.0
WRITE_US = {1_000: 20.8, 10_000: 311.0}  # one cpu.max write in the guest (bench/hierarchy.py)


def run(n: int, band: float, windows: int, drift: float, seed: int = 0) -> dict[str, float]:
    """Writes per decision and mean |S| over the windows after the first third, the node's
    speed drifting by `drift` (log spread)."""
    rng = np.random.default_rng(seed)
    cpus = n / 5
    open_loop = np.arange(n) % 2 == 1
    work = rng.uniform(0.02, 0.2, n) / cpus  # share-seconds a request (of T_R = all CPUs)
    even = 1.0 / n
    rate = np.where(open_loop, rng.uniform(0.2, 0.6, n) * even / work, np.nan)
    at_even = np.where(open_loop, md1_latency(work / (2 * even), np.nan_to_num(rate)),
                       work / even)
    target = at_even * rng.uniform(0.5, 1.6, n)
    fast = target * (1 - ALPHA)
    policy = Admit(alpha=ALPHA)
    policy.resize(n)
    limit = np.full(n, np.nan)
    moved, scratch, delta = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n)
    log_speed, writes, satisfied = 0.0, [], []
    keep = math.exp(-1.0 / DRIFT_WINDOWS)
    for k in range(windows):
        log_speed = keep * log_speed + drift * math.sqrt(1 - keep * keep) * rng.normal()
        cap = np.where(np.isnan(limit), even, limit)
        w = work * math.exp(log_speed)
        latency = np.where(open_loop, md1_latency(w / cap, np.nan_to_num(rate)), w / cap)
        usage = np.where(open_loop, np.minimum(np.nan_to_num(rate) * w, cap), cap)
        seen = latency * rng.lognormal(0.0, NOISE, n)
        count = np.where(open_loop, rate, usage / w)
        obs = Observation(target, np.where(np.isfinite(seen), seen, 1e3 * target), usage,
                          limit.copy(), rate=count, cpus=cpus)
        d = policy.decide(obs, float(k))
        policy.reset()
        assert d is not None
        moved_into(moved, d.limits, limit, band, delta, scratch)
        np.putmask(limit, moved, d.limits)
        if k >= windows // 3:
            writes.append(int(np.count_nonzero(moved)))
            fast_share = np.where(open_loop, _share_at(w, rate, fast), np.inf)
            in_band = np.abs(seen - target) <= ALPHA * target
            served = open_loop & (seen <= target * (1 + ALPHA)) & (limit <= fast_share)
            satisfied.append(int(np.count_nonzero(in_band | served)))
    return {"writes_per_decision": float(np.median(writes)),
            "satisfied": float(np.mean(satisfied))}


def _share_at(work: np.ndarray, rate: np.ndarray, latency: np.ndarray) -> np.ndarray:
    """The cap at which an M/D/1 service's mean latency is `latency` (bisection)."""
    lo = np.nan_to_num(rate) * work * (1 + 1e-9)
    hi = np.full_like(work, 1.0)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        slow = md1_latency(work / mid, np.nan_to_num(rate)) > latency
        lo, hi = np.where(slow, mid, lo), np.where(slow, hi, mid)
    return hi


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.dead_band", description=__doc__)
    p.add_argument("--quick", action="store_true", help="N = 1,000 only, fewer windows")
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("results"))
    args = p.parse_args(argv)
    windows = 30 if args.quick else 90
    rows = [{"n": n, "drift": drift, "band": band, **run(n, band, windows, drift)}
            for n in (NS[:1] if args.quick else NS) for drift in (0.0, DRIFT)
            for band in ((0.0, DEAD_BAND) if args.quick else BANDS)]
    lines = ["# cpu.max writes per decision, with and without the dead band", "",
             "Made by `python3 -m bench.dead_band` (host; a simulated node, admit's own "
             f"decisions and the actuator's own selection, {windows} windows, the last "
             "two thirds counted; see the module's docstring). The actuator's band: "
             f"{DEAD_BAND:.0%}.", "",
             "| N | node speed | band | limits written per decision (median) | kernel time "
             "for them (guest, one write at N cgroups) | mean S |", "|---|---|---|---|---|---|"]
    for r in rows:
        ms = r["writes_per_decision"] * WRITE_US[r["n"]] / 1e3
        speed = f"drifting {r['drift']:.0%}" if r["drift"] else "steady"
        lines.append(f"| {r['n']:,} | {speed} | {r['band']:.0%} | "
                     f"{r['writes_per_decision']:,.0f} | {ms:,.1f} ms | "
                     f"{r['satisfied']:,.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.quick:
        (args.out / "dead_band.md").write_text(text)
        (args.out / "dead_band.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
