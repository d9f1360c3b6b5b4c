"""An open-loop load generator for a lab pipeline (lab/pipeline_stage.py): requests arrive
at random (Poisson) at a rate that steps from phase to phase, plus bursts of many at once,
whether or not the earlier ones were answered; each request's end-to-end latency runs from
its arrival to the first stage's answer (which comes once the whole pipeline served it).

    python -m lab.pipeline_load --to framer:7000 --phase 60:2 --phase 60:4 \
        --burst 30:10 [--seed 1] [--out results.json]

Bounded: at most --max-in-flight requests wait for an answer at once (one thread each); an
arrival past that is counted as shed, not queued here (the generator never falls behind
its schedule), and each request has a deadline. The summary (one JSON object) is printed
and, with --out, written.
"""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lab.pipeline_stage import DEADLINE_S, FrameError, call, parse_address

MAX_IN_FLIGHT = 64
MAX_ARRIVALS = 100_000


@dataclass(frozen=True)
class Phase:
    duration_s: float
    rate: float  # requests a second, Poisson


@dataclass(frozen=True)
class Burst:
    at_s: float
    count: int  # requests arriving at once


def arrivals(phases: Sequence[Phase], bursts: Sequence[Burst] = (), seed: int = 0,
             ) -> np.ndarray:
    """Arrival times (seconds from the start, sorted) of the phases one after the other,
    and the bursts; at most MAX_ARRIVALS."""
    rng = np.random.default_rng(seed)
    times: list[float] = []
    start = 0.0
    for phase in phases:
        if phase.rate > 0:
            n = rng.poisson(phase.rate * phase.duration_s)
            times += sorted(start + rng.uniform(0, phase.duration_s, n))
        start += phase.duration_s
    times += [b.at_s for b in bursts for _ in range(b.count)]
    out = np.sort(np.asarray(times, dtype=float))
    if len(out) > MAX_ARRIVALS:
        raise ValueError(f"{len(out)} arrivals, over {MAX_ARRIVALS}")
    return out


@dataclass(frozen=True)
class Outcome:
    arrival_s: float
    latency_s: float  # nan if it failed or was shed
    hops: tuple[tuple[str, float], ...]  # each stage's own latency, in the answer
    error: str  # "" if answered


def run(to: tuple[str, int], times: np.ndarray, deadline_s: float = DEADLINE_S,
        max_in_flight: int = MAX_IN_FLIGHT) -> list[Outcome]:
    """Send a request to the stage at `to` at each of `times` (seconds from now); every
    request's outcome, in arrival order, once each is answered, failed or shed."""
    outcomes: list[Outcome | None] = [None] * len(times)
    slots = threading.BoundedSemaphore(max_in_flight)
    threads = []
    start = time.monotonic()

    def send(i: int, arrival: float) -> None:
        try:
            hops = call(to, i, arrival + deadline_s)
            outcomes[i] = Outcome(arrival - start, time.monotonic() - arrival, tuple(hops), "")
        except (OSError, TimeoutError, FrameError) as e:
            outcomes[i] = Outcome(arrival - start, math.nan, (), str(e)[:200] or type(e).__name__)
        finally:
            slots.release()

    for i, t in enumerate(times):
        arrival = start + float(t)
        wait = arrival - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        if not slots.acquire(blocking=False):
            outcomes[i] = Outcome(arrival - start, math.nan, (),
                                  f"shed: {max_in_flight} requests in flight")
            continue
        thread = threading.Thread(target=send, args=(i, arrival), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    assert all(o is not None for o in outcomes)
    return [o for o in outcomes if o is not None]


def wait_ready(to: tuple[str, int], within_s: float) -> int:
    """Send requests one at a time until one is answered end to end (the stages started,
    their names resolve); how many failed before. Raises TimeoutError past `within_s`."""
    deadline = time.monotonic() + within_s
    failed = 0
    while True:
        try:
            call(to, 0, min(deadline, time.monotonic() + DEADLINE_S))
            return failed
        except (OSError, TimeoutError, FrameError) as e:
            failed += 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer from {to[0]}:{to[1]} within {within_s} s: "
                                   f"{e}") from None
            time.sleep(1.0)


def summary(outcomes: Sequence[Outcome], duration_s: float) -> dict[str, Any]:
    """End-to-end latency (mean, p50, p95), each stage's own (mean) and its share of the
    end-to-end mean, requests answered a second, failures by reason."""
    answered = [o for o in outcomes if not o.error]
    latencies = np.array([o.latency_s for o in answered])
    stages: dict[str, list[float]] = {}
    for o in answered:
        for stage, seconds in o.hops:
            stages.setdefault(stage, []).append(seconds)
    mean = float(latencies.mean()) if len(latencies) else math.nan
    errors: dict[str, int] = {}
    for o in outcomes:
        if o.error:
            reason = o.error.split(":")[0][:80]
            errors[reason] = errors.get(reason, 0) + 1
    return {
        "requests": len(outcomes), "answered": len(answered),
        "rate_carried": len(answered) / duration_s if duration_s > 0 else math.nan,
        "e2e_mean_s": mean,
        "e2e_p50_s": float(np.percentile(latencies, 50)) if len(latencies) else math.nan,
        "e2e_p95_s": float(np.percentile(latencies, 95)) if len(latencies) else math.nan,
        "stage_mean_s": {s: float(np.mean(v)) for s, v in stages.items()},
        "stage_share": {s: float(np.mean(v)) / mean for s, v in stages.items()} if mean > 0
        else {},
        "errors": errors,
    }


def _phase(text: str) -> Phase:
    duration, _, rate = text.partition(":")
    return Phase(float(duration), float(rate))


def _burst(text: str) -> Burst:
    at, _, count = text.partition(":")
    return Burst(float(at), int(count))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.pipeline_load", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--to", type=parse_address, required=True, metavar="NAME:PORT",
                   help="the first stage")
    p.add_argument("--phase", type=_phase, action="append", required=True,
                   metavar="SECONDS:RATE", help="a phase of Poisson arrivals (repeat: steps)")
    p.add_argument("--burst", type=_burst, action="append", default=[], metavar="AT:COUNT")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline", type=float, default=DEADLINE_S, help="seconds a request")
    p.add_argument("--max-in-flight", type=int, default=MAX_IN_FLIGHT)
    p.add_argument("--ready-within", type=float, default=0.0, metavar="SECONDS",
                   help="first wait this long at most for one request answered end to end")
    p.add_argument("--out", type=Path, default=None, help="also write the summary here")
    args = p.parse_args(argv)
    if args.ready_within > 0:
        print(f"ready after {wait_ready(args.to, args.ready_within)} failed tries", flush=True)
    times = arrivals(args.phase, args.burst, args.seed)
    duration = sum(phase.duration_s for phase in args.phase)
    started = time.time()  # arrivals count from here: a reader aligns its own clock on it
    outcomes = run(args.to, times, args.deadline, args.max_in_flight)
    doc = summary(outcomes, duration)
    doc["start_unix"] = started
    doc["outcomes"] = [[o.arrival_s, o.latency_s, o.hops, o.error] for o in outcomes]
    text = json.dumps(doc)
    print(json.dumps({k: v for k, v in doc.items() if k != "outcomes"}), flush=True)
    if args.out:
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(args.out)  # whole or absent: a reader never sees half
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
