"""Every simulated scenario (s*, x*, o*) under the conditions of a real host: the measured
curves, a node speed that drifts (scenarios.PAPER_DRIFT), the packing shortfall of capped
single-threaded containers and the measurement noise of the noise sweep, over several
seeds, on the default platform and with each policy; judged phase by phase, node by node,
against the oracle.

    python -m bench.experiments --real-conditions [--quick] [--seeds N] [--first-seed K]
                                                  [--only KEY ...]
                                                  [--without curves|drift|packing|noise ...]

writes real-conditions.md and real-conditions.json beside the other results and prints the
table (with --without, which leaves those conditions out to see what each costs:
real-conditions-without-....md and .json). Beside the policies and the default platform,
the oracle's own allocation at each time held as caps under the same conditions, noise and
seeds (HELD): what the oracle's choice gets, window by window, without a policy's errors.
Reaction time: from the start of each phase that a change starts (a target, load, arrival
rate or node speed, a departure) until the total |S| first holds the oracle (or the phase's
final |S|, if lower), in seconds and in policy rounds.
"""

from __future__ import annotations

import json
import math
import multiprocessing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .analysis import (
    MIN_WINDOWS,
    TAIL,
    Phase,
    oracle_caps,
    phase_outcomes,
    reached,
    real_caps,
    real_oracle,
)
from .progress import Progress
from .runs import HELD, HELD_REAL, MODES, every_mode, load_curves, simulated
from .scenarios import (
    NOMINAL_CURVES,
    PAPER_DRIFT,
    PAPER_PARAMS,
    Scenario,
    open_scenarios,
    own_scenarios,
    paper_scenarios,
)
from .sim import KNOWN_LAG_S, Conditions, Curve
from .trace import Run

NOISE = 0.05  # the noise sweep's log-latency scatter
CONDITIONS = ("curves", "drift", "packing", "noise")  # what --without may leave out
SEEDS = 5
WINDOW_S = 5.0  # the observer's windows, as the other paper-scale simulations
JOBS = 2  # processes: the host has 2 cores
POLICY_MODES = tuple(m for m in MODES if m != "default")
JUDGED = (*MODES, HELD, HELD_REAL)
ORACLES = ("oracle", "real_oracle")  # what each phase is judged against (see real_oracle)
NAME = "real-conditions"


@dataclass(frozen=True)
class Setting:
    """What the runs add to the fluid model: curves, drift and packing, noise."""

    curves: dict[str, Curve]
    conditions: Conditions
    noise: float
    without: tuple[str, ...] = ()  # which of CONDITIONS were left out

    @classmethod
    def real(cls, measured: dict[str, Curve], without: tuple[str, ...] = ()) -> Setting:
        """All of a real host's conditions (the `measured` curves among them) but those
        named in `without`."""
        return cls(NOMINAL_CURVES if "curves" in without else measured,
                   Conditions(None if "drift" in without else PAPER_DRIFT,
                              packing="packing" not in without),
                   0.0 if "noise" in without else NOISE, tuple(without))

    @property
    def unknown_scatter(self) -> float:
        """The log-latency scatter that a controller cannot know when it sets its caps: the
        noise, and the drift over the KNOWN_LAG_S since the window it decides on."""
        drift = self.conditions.drift
        moved = 0.0 if drift is None else drift.spread**2 * (
            1.0 - math.exp(-2.0 * KNOWN_LAG_S / drift.correlation_s))
        return math.sqrt(self.noise**2 + moved)

    @property
    def name(self) -> str:
        return "-".join([NAME, *(["without", *self.without] if self.without else [])])

    def describe(self) -> str:
        parts = {"curves": "the measured curves (calibration.json, else nominal)",
                 "drift": f"a node speed that drifts (log-speed spread {PAPER_DRIFT.spread:g}, "
                          f"correlation {PAPER_DRIFT.correlation_s:g} s)",
                 "packing": "the packing shortfall of capped single-threaded containers",
                 "noise": f"a log-latency scatter of {NOISE:g}"}
        kept = [text for key, text in parts.items() if key not in self.without]
        left = f" (left out: {', '.join(self.without)})" if self.without else ""
        return ", ".join(kept) + left


@dataclass(frozen=True)
class Reaction:
    """How long a run took, from the start of a phase, to hold the level it is judged by."""

    level: int  # the oracle's total |S|, or the phase's final total if lower
    seconds: float | None  # None: never held it
    rounds: int | None  # policy rounds by then (the most of any node); None on the default


def all_scenarios(quick: bool = False) -> list[Scenario]:
    return paper_scenarios(quick) + own_scenarios(quick) + open_scenarios(quick)


def reaction(run: Run, ph: Phase, oracle_s: int) -> Reaction:
    """When the run's total |S| first held min(`oracle_s`, final) in the phase `ph`."""
    level = min(oracle_s, ph.final_s)
    total = run.satisfied()
    inside = (run.t > ph.start) & (run.t <= ph.end + 1e-9)
    step = float(run.t[1] - run.t[0]) if len(run.t) > 1 else 1.0
    hold = max(TAIL * (ph.end - ph.start), MIN_WINDOWS * step)
    when = reached(run.t[inside], total[inside], level, hold)
    rounds = None if when is None or not any(run.decisions) else max(
        int(np.count_nonzero((np.array(d) > ph.start) & (np.array(d) <= when)))
        for d in run.decisions)
    return Reaction(level, None if when is None else when - ph.start, rounds)


def judge(scenario: Scenario, seed: int, setting: Setting) -> list[dict[str, Any]]:
    """One scenario and seed in every mode (and HELD) in `setting`: a row per phase."""
    curves = setting.curves
    nodes = scenario.build(curves)
    runs = every_mode(scenario, nodes, curves, PAPER_PARAMS, WINDOW_S, setting.noise, seed,
                      setting.conditions)
    packing, scatter = setting.conditions.packing, setting.unknown_scatter
    for mode, caps in ((HELD, lambda node: oracle_caps(node, curves)),
                       (HELD_REAL, lambda node: real_caps(node, curves, scatter, packing,
                                                          window=WINDOW_S))):
        runs[mode] = simulated(scenario, nodes, curves, None, scenario.duration_s, WINDOW_S,
                               setting.noise, seed, setting.conditions, held=(mode, caps))
    judged = {mode: phase_outcomes(run, curves, bound=False) for mode, run in runs.items()}
    drift = runs["admit"].notes["drift"]  # the same for every mode of the seed
    rows = []
    for k, ph in enumerate(judged["admit"]):
        speeds = tail_speeds(runs["admit"].t, drift, ph)
        row: dict[str, Any] = {"scenario": scenario.key, "seed": seed,
                               "phase": [ph.start, ph.end], "after_change": k > 0,
                               "oracle": ph.oracle, "speed": speeds,
                               "real_oracle": [real_oracle(
                                   node, curves, scatter, at=(ph.start + ph.end) / 2,
                                   speed=speed, packing=packing, window=WINDOW_S)
                                   for node, speed in zip(nodes, speeds, strict=True)],
                               "modes": {}}
        for mode, phases in judged.items():
            if k >= len(phases):  # the default platform's shorter run (real scenarios only)
                continue
            mine = phases[k]
            react = reaction(runs[mode], mine, sum(row["real_oracle"]))
            row["modes"][mode] = {"final": mine.final, "reaction_s": react.seconds,
                                  "rounds": react.rounds, "level": react.level}
        rows.append(row)
    return rows


def tail_speeds(t: np.ndarray, drift: list[list[float]], ph: Phase) -> list[float]:
    """Each node's median drift work factor over the tail of the phase `ph` (the windows
    its final |S| is the median of): the node's speed in its median window."""
    step = float(t[1] - t[0]) if len(t) > 1 else 1.0
    hold = max(TAIL * (ph.end - ph.start), MIN_WINDOWS * step)
    tail = (t > ph.start) & (t <= ph.end + 1e-9) & (t > ph.end - hold)
    return [float(np.median(np.asarray(d)[:len(t)][tail])) for d in drift]


def _judge_task(task: tuple[Scenario, int, Setting]) -> list[dict[str, Any]]:
    return judge(*task)


def verdicts(row: dict[str, Any], mode: str, against: str = "real_oracle",
             ) -> tuple[bool, bool]:
    """Whether the mode ended at the oracle (`against`: one of ORACLES) on every node of
    the phase, and within one."""
    final, oracle = row["modes"][mode]["final"], row[against]
    return (all(f >= o for f, o in zip(final, oracle, strict=True)),
            all(f >= o - 1 for f, o in zip(final, oracle, strict=True)))


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mode: phases (scenario x phase x seed) at the real oracle on every node, within
    one on every node, out of how many, and the mean shortfall under it per node; the same
    against the nominal oracle under "nominal"."""
    out: dict[str, dict[str, Any]] = {}
    for mode in JUDGED:
        mine = [r for r in rows if mode in r["modes"]]
        counts: dict[str, dict[str, Any]] = {}
        for against in ORACLES:
            judged = [verdicts(r, mode, against) for r in mine]
            short = [o - f for r in mine
                     for o, f in zip(r[against], r["modes"][mode]["final"], strict=True)]
            counts[against] = {"at_oracle": sum(a for a, _ in judged),
                               "within_one": sum(w for _, w in judged),
                               "phases": len(judged),
                               "mean_shortfall": float(np.mean(short)) if short else 0.0}
        out[mode] = {**counts["real_oracle"], "nominal": counts["oracle"]}
    return out


def reactions(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per policy, over the phases a change starts: how many held their level, and the
    median and largest reaction time (s) and rounds of those."""
    out = {}
    for mode in POLICY_MODES:
        changed = [r for r in rows if r["after_change"]]
        held = [r["modes"][mode] for r in changed if r["modes"][mode]["reaction_s"] is not None]
        seconds = [h["reaction_s"] for h in held]
        rounds = [h["rounds"] for h in held if h["rounds"] is not None]
        out[mode] = {"events": len(changed), "held": len(held),
                     "at_oracle": sum(verdicts(r, mode)[0] for r in changed),
                     "median_s": float(np.median(seconds)) if seconds else None,
                     "max_s": max(seconds, default=None),
                     "median_rounds": float(np.median(rounds)) if rounds else None,
                     "max_rounds": max(rounds, default=None)}
    return out


def _nodes(values: list[int]) -> str:
    return " ".join(str(v) for v in values)


def _reaction_cell(cell: dict[str, Any], after_change: bool) -> str:
    if not after_change:
        return ""
    if cell["reaction_s"] is None:
        return f"never ({cell['level']})"
    rounds = "" if cell["rounds"] is None else f", {cell['rounds']} r"
    return f"{cell['reaction_s']:.0f} s{rounds}"


def markdown(rows: list[dict[str, Any]], seeds: int, quick: bool, setting: Setting,
             first_seed: int = 0) -> str:
    """The report: the headline counts, the reaction times, then the table row by row."""
    head = summary(rows)
    flags = (" --quick" if quick else "") + \
        (f" --without {' '.join(setting.without)}" if setting.without else "")
    lines = [f"# Under real conditions{' (quick)' if quick else ''}", "",
             f"Made by `python3 -m bench.experiments --real-conditions{flags}`: every "
             f"simulated scenario (s*, x*, o*) with {setting.describe()}, over {seeds} "
             f"seed(s){f' from {first_seed}' if first_seed else ''}. Each phase's final |S| "
             "(median over its tail) per node against two oracles per node: the real oracle "
             "(analysis.real_oracle: the oracle at the node's speed in the tail's median "
             "window, its caps packed, and at most the next whole number above noisy_bound "
             f"at the scatter no controller can know, {setting.unknown_scatter:.3f}, a "
             f"service's as its {WINDOW_S:g} s windows show it: analysis.windows_seen), and "
             f"the nominal oracle (nominal needs, no drift, packing or noise). '{HELD}': the "
             "nominal oracle's own allocation held as caps under the same conditions (no "
             f"policy); '{HELD_REAL}': the real oracle's (analysis.real_caps: its count, "
             f"moved towards the middle of the band as far as the packed caps fit, at the "
             f"speed of {KNOWN_LAG_S:g} s before).", "",
             "| mode | at the real oracle (every node) | within one | mean shortfall per node "
             "| at the nominal oracle | within one | mean shortfall | phases |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {mode} | {c['at_oracle']} | {c['within_one']} | {c['mean_shortfall']:.2f} | "
              f"{c['nominal']['at_oracle']} | {c['nominal']['within_one']} | "
              f"{c['nominal']['mean_shortfall']:.2f} | {c['phases']} |"
              for mode, c in head.items()]
    lines += ["", "Reaction after a change (until |S| holds the real oracle, or the phase's "
              "final |S| if lower):", "",
              "| policy | phases after a change | at the oracle | held its level | median "
              "| largest |", "|---|---|---|---|---|---|"]
    for mode, r in reactions(rows).items():
        median = "-" if r["median_s"] is None else \
            f"{r['median_s']:.0f} s, {r['median_rounds']:g} rounds"
        largest = "-" if r["max_s"] is None else f"{r['max_s']:.0f} s, {r['max_rounds']} rounds"
        lines.append(f"| {mode} | {r['events']} | {r['at_oracle']} | {r['held']} | {median} "
                     f"| {largest} |")
    lines += ["", "| scenario | phase (s) | seed | speed | nominal oracle | real oracle | "
              + " | ".join(JUDGED) + " | " + " | ".join(f"{m} reaction" for m in POLICY_MODES)
              + " |", "|---" * (6 + len(JUDGED) + len(POLICY_MODES)) + "|"]
    for r in rows:
        modes = r["modes"]
        finals = [_nodes(modes[m]["final"]) if m in modes else "-" for m in JUDGED]
        react = [_reaction_cell(modes[m], r["after_change"]) for m in POLICY_MODES]
        lines.append(f"| {r['scenario']} | {r['phase'][0]:.0f}-{r['phase'][1]:.0f} | "
                     f"{r['seed']} | {' '.join(f'{v:.2f}' for v in r['speed'])} | "
                     f"{_nodes(r['oracle'])} | {_nodes(r['real_oracle'])} | "
                     + " | ".join(finals + react)
                     + " |")
    return "\n".join(lines) + "\n"


def run(out: Path, quick: bool = False, seeds: int = SEEDS, only: list[str] | None = None,
        jobs: int = JOBS, without: tuple[str, ...] = (), first_seed: int = 0,
        ) -> dict[str, dict[str, float]]:
    """Judge every scenario (or those named in `only`) over `seeds` seeds (from
    `first_seed`: others than those a change was looked at on), with every
    condition but those `without`; write real-conditions[-without-...].md and .json in
    `out`, print the table, return the headline counts."""
    setting = Setting.real(load_curves(out / "calibration.json"), without)
    scenarios = [sc for sc in all_scenarios(quick) if not only or sc.key in only]
    if only and len(scenarios) < len(only):
        known = {sc.key for sc in all_scenarios(quick)}
        raise SystemExit(f"unknown scenarios: {sorted(set(only) - known)}")
    tasks = [(sc, seed, setting) for sc in scenarios
             for seed in range(first_seed, first_seed + seeds)]
    progress = Progress(len(tasks) + 1)
    progress.step(f"{len(scenarios)} scenarios x {seeds} seeds x {len(JUDGED)} modes, "
                  f"{jobs} processes")
    rows: list[dict[str, Any]] = []
    with multiprocessing.get_context("fork").Pool(max(1, min(jobs, len(tasks)))) as pool:
        for task, judged in zip(tasks, pool.imap(_judge_task, tasks), strict=True):
            progress.step(f"judged {task[0].key}, seed {task[1]}")
            rows += judged
    text = markdown(rows, seeds, quick, setting, first_seed)
    (out / f"{setting.name}.md").write_text(text)
    head = summary(rows)
    drift = setting.conditions.drift
    (out / f"{setting.name}.json").write_text(json.dumps(
        {"quick": quick, "seeds": seeds, "first_seed": first_seed, "noise": setting.noise,
         "without": setting.without,
         "drift": drift and {"spread": drift.spread, "correlation_s": drift.correlation_s},
         "packing": setting.conditions.packing, "summary": head,
         "reactions": reactions(rows), "rows": rows}, indent=1) + "\n")
    progress.close(f"results in {out / setting.name}.md")
    print(text)
    return head
