"""Plots (PNG, like the paper's figures) and the summary (summary.md, summary.json): every
scenario with each policy beside the oracle and the default platform."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from dqoes_cg.policy import DEFAULT_POLICY, POLICIES
from lab.demo import draw_latency

from .analysis import Agreement, Phase, agreement, outcome, phase_outcomes
from .scenarios import PAPER_PARAMS, REAL_PARAMS, Scenario
from .sim import Curve, Params
from .trace import Run

S_TOLERANCE = 1  # containers: simulated and real final |S| agree within this
SHARE_TOLERANCE = 0.10  # CPUs: mean |difference| of the converged CPU shares
WIDE_ALPHA = 0.25  # real runs counted again with a band wider than the host's speed swings
COMMAND = "python -m bench.experiments"
POLICY_NAMES = tuple(POLICIES)
MODES = ("default", *POLICY_NAMES)
FAITHFUL = "dqoes"  # the paper's policy, the one every other is held against
OTHERS = tuple(p for p in POLICY_NAMES if p != FAITHFUL)
QUICK_FIGURES = ("s2-identical-achievable", "x2-load-phase")  # --quick draws only these


def write(out: Path, measured: dict[str, Curve], curves: dict[str, Curve],
          scenarios: list[Scenario], sim_runs: dict[str, dict[str, Run]],
          sweep: dict[str, dict[tuple[float, float], Run]],
          noisy: dict[str, list[dict[str, Run]]], reals: list[Scenario],
          real_runs: dict[str, dict[str, Any]], quick: bool) -> None:
    sims = {sc.key: _sim_entry(sc, sim_runs[sc.key], curves) for sc in scenarios}
    for sc in scenarios:
        if quick and sc.key not in QUICK_FIGURES:
            continue
        _figure(out / f"{sc.key}.png", sc, sim_runs[sc.key], sims[sc.key]["phases"], None,
                f"simulated, dqoesd's defaults ({_params(PAPER_PARAMS)})")
    noise = {sc.key: _noise_entry(noisy[sc.key], curves) for sc in scenarios}
    _noise_figure(out / "noise-sweep.png", scenarios, noise)
    real_rows = []
    for sc in reals:
        runs = real_runs.get(sc.key)
        if runs is None:
            continue
        real_rows.append(_real_row(sc, runs))
        _figure(out / f"{sc.key}.png", sc, runs["real"], real_rows[-1]["phases"], runs["sim"],
                f"real kernel (qemu guest, 2 vCPUs), {_params(REAL_PARAMS)}")
    _calibration_figure(out / "calibration.png", measured)
    sweep_table = {key: {f"beta={b:g} iv_max={iv:g}": _last(phase_outcomes(r, curves)).final_s
                         for (b, iv), r in runs.items()} for key, runs in sweep.items()}
    (out / "summary.json").write_text(json.dumps(
        {"command": COMMAND + " --quick" * quick, "policies": list(POLICY_NAMES),
         "default_policy": DEFAULT_POLICY, "paper_params": asdict(PAPER_PARAMS),
         "real_params": asdict(REAL_PARAMS),
         "calibration": {m: asdict(c) for m, c in measured.items()},
         "simulated": {k: _jsonable(v) for k, v in sims.items()},
         "noise": {"scatter": _scatter_of(noisy), **_jsonable(noise)},
         "real": [_jsonable(r) for r in real_rows], "sweep": sweep_table},
        indent=1) + "\n")
    (out / "summary.md").write_text(_markdown(scenarios, sims, noise, noisy, real_rows,
                                              sweep_table, measured, quick))


def _params(p: Params) -> str:
    return (f"alpha {p.alpha:g}, beta {p.beta:g}, IV {p.iv_initial:g}-{p.iv_max:g} s, "
            f"tick {p.sample_interval:g} s")


def _last(phases: list[Phase]) -> Phase:
    return phases[-1]


def _jsonable(x: Any) -> Any:
    if isinstance(x, Phase):
        return asdict(x)
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_jsonable(v) for v in x]
    return x


def _sim_entry(sc: Scenario, runs: dict[str, Run], curves: dict[str, Curve]) -> dict[str, Any]:
    """Each mode's phases (the oracle of each phase is the same for all)."""
    phases = {mode: phase_outcomes(runs[mode], curves) for mode in MODES}
    return {"title": sc.title, "paper": sc.paper, "containers": sc.size, "phases": phases}


def _noise_entry(seeded: list[dict[str, Run]], curves: dict[str, Curve]) -> dict[str, Any]:
    """Per mode and seed, each phase's outcome; the worst node's gap to its oracle; whether
    each policy is never below the faithful DQoES (every phase, seed and node)."""
    phases = {mode: [phase_outcomes(runs[mode], curves) for runs in seeded] for mode in MODES}
    worst = {mode: min(f - o for per_seed in phases[mode] for ph in per_seed
                       for f, o in zip(ph.final, ph.oracle, strict=True))
             for mode in POLICY_NAMES}
    never_below = {mode: all(f >= g for mine, theirs in zip(phases[mode], phases[FAITHFUL],
                                                            strict=True)
                             for a, b in zip(mine, theirs, strict=True)
                             for f, g in zip(a.final, b.final, strict=True))
                   for mode in POLICY_NAMES if mode != FAITHFUL}
    to_bound = {mode: min(m - b for per_seed in phases[mode] for ph in per_seed
                          for m, b in zip(ph.mean, ph.bound or ph.oracle, strict=True))
                for mode in POLICY_NAMES}
    return {"phases": phases, "worst_node_gap": worst, "never_below_dqoes": never_below,
            "worst_bound_gap": to_bound}


def _scatter_of(noisy: dict[str, list[dict[str, Run]]]) -> float:
    runs = next(iter(noisy.values()), [{}])
    return float(next(iter(runs[0].values())).notes.get("noise", 0.0)) if runs[0] else 0.0


def _real_row(sc: Scenario, runs: dict[str, Any]) -> dict[str, Any]:
    real, sim, quiet, local = runs["real"], runs["sim"], runs["quiet"], runs["curves"]
    phases = {mode: phase_outcomes(real[mode], local) for mode in MODES}
    agree: dict[str, Agreement] = {mode: agreement(real[mode], sim[mode]) for mode in MODES}
    return {"scenario": sc.key, "title": sc.title, "containers": sc.size,
            "oracle": _last(phases[DEFAULT_POLICY]).oracle_s, "phases": phases,
            "wide": {mode: outcome(real[mode], WIDE_ALPHA).final_s for mode in MODES},
            "sim": {mode: agree[mode].sim_s for mode in MODES},
            "quiet": {mode: _last(phase_outcomes(quiet[mode], local)).final_s
                      for mode in MODES},
            "share_error": {mode: agree[mode].share_error for mode in MODES},
            "agrees": all(a.within(S_TOLERANCE, SHARE_TOLERANCE) for a in agree.values())}


# --- summary.md ----------------------------------------------------------------------------


def _reached(ph: Phase) -> str:
    """'8 (20 s, 2 rounds)': the final |S| and when it first held."""
    if ph.final_s == 0:
        return "0"
    if ph.reached_s is None:
        return f"{ph.final_s} (never held)"
    rounds = "" if ph.rounds is None else f", {ph.rounds} round{'s' * (ph.rounds != 1)}"
    return f"{ph.final_s} ({ph.reached_s:.0f} s{rounds})"


def _cell(text: str) -> str:
    """Text for a markdown table cell."""
    return text.replace("|", "\\|")


def _phase_name(ph: Phase, first: bool) -> str:
    start = "last arrival" if first else f"{ph.start:.0f} s"
    return f"{start} to {ph.end:.0f} s"


def _markdown(scenarios: list[Scenario], sims: dict[str, dict[str, Any]],
              noise: dict[str, dict[str, Any]], noisy: dict[str, list[dict[str, Run]]],
              real_rows: list[dict[str, Any]], sweep: dict[str, dict[str, int]],
              curves: dict[str, Curve], quick: bool) -> str:
    cols = " | ".join(f"{p} \\|S\\| (reached)" for p in POLICY_NAMES)
    lines = [
        "# Evaluation: the paper's experiments (section V) and our own", "",
        f"Made by `{COMMAND}{' --quick' * quick}` (see bench/experiments/__main__.py), for "
        f"each policy of dqoesd ({', '.join(f'`{p}`' for p in POLICY_NAMES)}; the default is "
        f"`{DEFAULT_POLICY}`) and the default platform (no limits: CFS's even share). |S| is "
        "the number of containers within alpha = 10% of their target; a run is judged phase "
        "by phase, a phase running from the last arrival to the first change (a target, a "
        "load, a departure), from there to the next, and so on to the end. Final = the "
        "median |S| over the last 15% of the phase (at least 6 windows); 'reached' = when "
        "|S| first held that level, in seconds and policy rounds from the phase's start. "
        "The oracle is the most containers that can be in S at once in the phase, given the "
        "CPUs, each container's latency curve, load and usable maximum (its threads), and a "
        "floor of 1/(2n) of the budget per container (analysis.oracle).", "",
        "## The paper's scenarios at its scale (simulated)", "",
        f"Simulated 2-CPU nodes, 10 containers each; dqoesd's defaults, which are the "
        f"paper's alpha, beta and IV_initial with a ceiling of the interval (the paper "
        f"gives none): {_params(PAPER_PARAMS)}.", "",
        f"| scenario | n | paper | oracle | {cols} | default \\|S\\| |",
        "|---" * (5 + len(POLICY_NAMES)) + "|",
    ]
    papers = [sc for sc in scenarios if sc.key.startswith("s")]
    owns = [sc for sc in scenarios if not sc.key.startswith("s")]
    for sc in papers:
        ph = {m: _last(sims[sc.key]["phases"][m]) for m in MODES}
        lines.append(f"| {sc.key}: {_cell(sc.title)} | {sc.size} | {_cell(sc.paper)} | "
                     f"{ph[DEFAULT_POLICY].oracle_s} | " +
                     " | ".join(_reached(ph[p]) for p in POLICY_NAMES) +
                     f" | {ph['default'].final_s} |")
    lines += ["", "## Beyond the paper (simulated)", "",
              "Our own scenarios at the same scale (2-CPU nodes unless said), each change "
              "starting a phase judged on its own.", "",
              f"| scenario | phase | oracle | {cols} | default \\|S\\| |",
              "|---" * (4 + len(POLICY_NAMES)) + "|"]
    for sc in owns:
        phases = sims[sc.key]["phases"]
        for k, ph in enumerate(phases[DEFAULT_POLICY]):
            lines.append(f"| {sc.key + ': ' + _cell(sc.title) if k == 0 else ''} | "
                         f"{_phase_name(ph, k == 0)} | {ph.oracle_s} | " +
                         " | ".join(_reached(phases[p][k]) for p in POLICY_NAMES) +
                         f" | {phases['default'][k].final_s} |")
    lines += _noise_section(scenarios, noise, noisy)
    keys = list(next(iter(sweep.values())).keys()) if sweep else []
    lines += ["", "## Sensitivity of DQoES: final |S| against the step beta and the "
              "listener's ceiling iv_max (simulated, alpha 0.1, IV_initial 10 s)", "",
              "| scenario | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    lines += [f"| {k} | " + " | ".join(str(v[c]) for c in keys) + " |"
              for k, v in sweep.items()]
    lines += _against_the_paper(sims, real_rows, sweep)
    lines += _real_section(real_rows)
    lines += _calibration_section(curves)
    lines += _closing(scenarios, sims, noise, real_rows)
    lines += ["", "Figures: `<scenario>.png` (|S| over time with the oracle, latency / target "
              "and CPU per policy, the summed gaps Q_G and Q_B), `noise-sweep.png`, "
              "`calibration.png`.", ""]
    return "\n".join(lines)


def _noise_section(scenarios: list[Scenario], noise: dict[str, dict[str, Any]],
                   noisy: dict[str, list[dict[str, Run]]]) -> list[str]:
    seeds = len(next(iter(noisy.values()), []))
    scatter = _scatter_of(noisy)
    lines = ["", f"## Measurement noise (simulated): log-latency scatter {scatter:g}, "
             f"{seeds} seed{'s' * (seeds != 1)}", "",
             "Every window's measured latency (the daemon's and the observer's) is multiplied "
             f"by a log-normal factor of standard deviation {scatter:g}, independently. Final "
             "|S| of each phase ('/' between phases), one row per seed; the worst node's gap is "
             "the least, over phases, seeds and nodes, of final |S| minus that node's oracle.",
             "",
             "The oracle counts containers held still inside their band. Through the noise, "
             "a container held anywhere is seen outside its band in some windows: no "
             "controller can expect as many in S, and the median of a short phase's tail "
             "lands a whole container lower in some seeds. So each phase also has a bound "
             "(in brackets, summed over nodes): the most containers any controller can "
             "expect in S in a window at this noise, under the oracle's rules (an upper "
             "bound: analysis.noisy_bound). Against it each policy's mean |S| over the "
             "phase's tail: the least, over phases, seeds and nodes, of that mean minus the "
             "node's bound. The bound need not be reached (it is the dual of a problem that is "
             "not concave): a gap of some tenths of a container need not be the controller's.",
             "", "| scenario | oracle (bound under noise) | " +
             " | ".join(f"{p} \\|S\\| by seed" for p in POLICY_NAMES) + " | " +
             " | ".join(f"{p}: worst node vs oracle" for p in POLICY_NAMES) +
             " | lowest of each phase and seed: " + " vs ".join(POLICY_NAMES) + " | " +
             " | ".join(f"{p}: worst node's mean vs bound" for p in POLICY_NAMES) + " | " +
             " | ".join(f"{p} never below {FAITHFUL} (every phase, seed, node)"
                        for p in OTHERS) + " |",
             "|---" * (3 + 3 * len(POLICY_NAMES) + len(OTHERS)) + "|"]
    for sc in scenarios:
        entry = noise[sc.key]["phases"]
        oracle = " / ".join(f"{ph.oracle_s} ({sum(ph.bound or ph.oracle):.1f})"
                            for ph in entry[DEFAULT_POLICY][0])
        by_seed = {p: "<br>".join(" / ".join(str(ph.final_s) for ph in per_seed)
                                  for per_seed in entry[p]) for p in POLICY_NAMES}
        lowest = {p: min(ph.final_s - ph.oracle_s for per_seed in entry[p] for ph in per_seed)
                  for p in POLICY_NAMES}
        lines.append(f"| {sc.key} | {oracle} | " +
                     " | ".join(by_seed[p] for p in POLICY_NAMES) + " | " +
                     " | ".join(f"{noise[sc.key]['worst_node_gap'][p]:+d}"
                                for p in POLICY_NAMES) + " | " +
                     " vs ".join(f"{lowest[p]:+d}" for p in POLICY_NAMES) + " | " +
                     " | ".join(f"{noise[sc.key]['worst_bound_gap'][p]:+.2f}"
                                for p in POLICY_NAMES) + " | " +
                     " | ".join("yes" if noise[sc.key]["never_below_dqoes"][p] else "no"
                                for p in OTHERS) + " |")
    return lines


def _against_the_paper(sims: dict[str, dict[str, Any]], real_rows: list[dict[str, Any]],
                       sweep: dict[str, dict[str, int]]) -> list[str]:
    """Each of the paper's claims against what was measured here."""
    real = {r["scenario"]: r for r in real_rows}

    def got_sim(key: str) -> str:
        if key not in sims:
            return "not run"
        ph = {m: _last(sims[key]["phases"][m]) for m in MODES}
        return (", ".join(f"{p} {ph[p].final_s}" for p in POLICY_NAMES) +
                f" of {sims[key]['containers']} (default {ph['default'].final_s}, oracle "
                f"{ph[DEFAULT_POLICY].oracle_s})")

    def got_real(key: str) -> str:
        r = real.get(key)
        if r is None:
            return "not run"
        ph = {m: _last(r["phases"][m]) for m in MODES}
        return (", ".join(f"{p} {ph[p].final_s}" for p in POLICY_NAMES) +
                f" of {r['containers']} (default {ph['default'].final_s}, oracle "
                f"{r['oracle']})")

    def best(key: str) -> str:
        if key not in sweep:
            return "-"
        setting, count = max(sweep[key].items(), key=lambda kv: kv[1])
        return f"{count} at {setting}"

    claims = [
        ("Identical unachievable targets: all stay in B at an even share",
         "s1-identical-unachievable", "r1-identical-unachievable"),
        ("Identical achievable targets: 10/10 in S", "s2-identical-achievable",
         "r2-identical-achievable"),
        ("Varied targets, burst: 7/10 in S", "s3-varied-burst", "r3-varied-burst"),
        ("Varied targets, fixed interval: 8/10 in S", "s3-varied-fixed", "r3-varied-fixed"),
        ("Several models, random targets and arrivals", "s4-multi-model", "r4-multi-model"),
        ("Cluster: 26/40 in S with DQoES, 3/40 with the default", "s5-cluster",
         "r5-cluster"),
    ]
    lines = ["", "## Against the paper", "",
             "| the paper | simulated, dqoesd's defaults | DQoES's best in the sweep | "
             "real (scaled) |", "|---|---|---|---|"]
    lines += [f"| {claim} | {got_sim(s_key)} | {best(s_key)} | {got_real(r_key)} |"
              for claim, s_key, r_key in claims]
    return lines


def _real_section(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["", "## Real runs (qemu guest: real kernel, 2 emulated CPUs) and the "
             "simulator's validation", "",
             f"Scaled to 2 CPUs (4 to 6 containers); {_params(REAL_PARAMS)}. The simulator "
             "runs the same containers, targets and arrivals, given each real run's scatter "
             "(the standard deviation of its log latency over the converged tail). It agrees "
             f"when the final |S| is within {S_TOLERANCE} and the converged CPU shares within "
             f"{SHARE_TOLERANCE:g} CPU on average, for every mode (near-identical "
             "containers compared share by share in sorted order: analysis.agreement). The "
             "emulated CPUs' speed "
             "swings within a run whenever other work shares the host's cores, at times by "
             f"more than the 10% band, so |S| is also counted within {WIDE_ALPHA:.0%} of the "
             "targets (the daemon still used 10%). 'Quiet' is the simulation without "
             "scatter: the same controller on a kernel whose speed holds still. The oracle "
             "comes from the simulator's curves at the run's speed, so a noisy run can beat "
             "it by one.", "",
             "| scenario | n | oracle | " +
             " | ".join(f"real {m} (reached)" for m in MODES) +
             f" | within {WIDE_ALPHA:.0%}: " + " / ".join(MODES) +
             " | sim: " + " / ".join(MODES) + " | quiet: " + " / ".join(MODES) +
             " | share error (CPU): " + " / ".join(MODES) + " | agrees |",
             "|---" * (8 + len(MODES)) + "|"]
    for r in rows:
        ph = {m: _last(r["phases"][m]) for m in MODES}
        lines.append(
            f"| {r['scenario']}: {_cell(r['title'])} | {r['containers']} | {r['oracle']} | " +
            " | ".join(_reached(ph[m]) if m != "default" else str(ph[m].final_s)
                       for m in MODES) + " | " +
            " / ".join(str(r["wide"][m]) for m in MODES) + " | " +
            " / ".join(str(r["sim"][m]) for m in MODES) + " | " +
            " / ".join(str(r["quiet"][m]) for m in MODES) + " | " +
            " / ".join(f"{r['share_error'][m]:.3f}" for m in MODES) + " | " +
            ("yes" if r["agrees"] else "no") + " |")
    if not rows:
        lines.append("| (no real runs in this results directory) |" + " |" * (7 + len(MODES)))
    return lines


def _calibration_section(curves: dict[str, Curve]) -> list[str]:
    cores = next(iter(curves.values())).cores
    lines = ["", "## Calibration (calibration.json, calibration.png)", "",
             "Each worker type alone at a few cpu.max quotas, with the other CPU kept busy: "
             "latency x quota / solo latency (1 = latency inversely proportional to the CPU "
             "share). The simulator takes latency = solo / share, and each real scenario's "
             "own default run sets the speed its simulation uses (its even-share latencies); "
             "where a factor departs from 1, the simulated curve is off by that much at that "
             "share, and the validation above shows what it costs.", "",
             "| model | solo latency |" + "".join(f" at {c:g} CPU |" for c in cores),
             "|---" * (2 + len(cores)) + "|"]
    lines += [f"| {m} | {c.solo_s * 1e3:.0f} ms |" + "".join(f" {f:.2f} |" for f in c.factors)
              for m, c in curves.items()]
    return lines


def _closing(scenarios: list[Scenario], sims: dict[str, dict[str, Any]],
             noise: dict[str, dict[str, Any]], real_rows: list[dict[str, Any]]) -> list[str]:
    """Every scenario's |S| and the rounds to reach it, for each policy."""
    lines = ["", "## Closing note: |S| and rounds to reach it, per scenario and phase", "",
             "Simulated without noise (rounds: policy decisions from the phase's start until "
             "|S| held its final level), then the noise sweep's worst node, then the real "
             "runs (seconds from the last arrival; the daemon's rounds are not recorded).", "",
             "| scenario, phase | oracle | " +
             " | ".join(f"{p}: \\|S\\|, rounds" for p in POLICY_NAMES) + " |",
             "|---" * (2 + len(POLICY_NAMES)) + "|"]

    def cell(ph: Phase) -> str:
        return f"{ph.final_s}, {'-' if ph.rounds is None else ph.rounds}"

    for sc in scenarios:
        phases = sims[sc.key]["phases"]
        for k, ph in enumerate(phases[DEFAULT_POLICY]):
            name = sc.key if len(phases[DEFAULT_POLICY]) == 1 else \
                f"{sc.key}, {_phase_name(ph, k == 0)}"
            lines.append(f"| {name} | {ph.oracle_s} | " +
                         " | ".join(cell(phases[p][k]) for p in POLICY_NAMES) + " |")
    lines += ["", "| noise sweep, over scenarios | " + " | ".join(POLICY_NAMES) + " |",
              "|---" * (1 + len(POLICY_NAMES)) + "|",
              "| worst node: final \\|S\\| vs oracle | " + " | ".join(
                  f"{min(n['worst_node_gap'][p] for n in noise.values()):+d}"
                  for p in POLICY_NAMES) + " |",
              "| worst node: mean \\|S\\| vs bound under noise | " + " | ".join(
                  f"{min(n['worst_bound_gap'][p] for n in noise.values()):+.2f}"
                  for p in POLICY_NAMES) + " |"]
    if real_rows:
        lines += ["", "| real run | oracle | " + " | ".join(
            f"{p}: \\|S\\| (reached)" for p in POLICY_NAMES) + " | default |",
            "|---" * (3 + len(POLICY_NAMES)) + "|"]
        for r in real_rows:
            ph = {m: _last(r["phases"][m]) for m in MODES}
            lines.append(f"| {r['scenario']} | {r['oracle']} | " +
                         " | ".join(_reached(ph[p]) for p in POLICY_NAMES) +
                         f" | {ph['default'].final_s} |")
    return lines


# --- figures -----------------------------------------------------------------------------


def _figure(path: Path, sc: Scenario, runs: dict[str, Run], phases: dict[str, list[Phase]],
            sims: dict[str, Run] | None, where: str) -> None:
    """|S| over time for every mode (and the simulation of a real run, dotted) with the
    oracle of each phase; per policy, latency / target and the stacked CPU use; the summed
    gaps Q_G and Q_B."""
    ncols = 1 + len(POLICY_NAMES)
    fig, axes = plt.subplots(2, ncols, figsize=(6.5 * ncols, 8))
    ax_s, ax_q = axes[0, 0], axes[1, 0]
    first = runs[POLICY_NAMES[0]]
    for mode, style in zip(MODES, ("--", "-", "-", "-.", ":"), strict=False):
        ax_s.step(runs[mode].t, runs[mode].satisfied(), ls=style, lw=1.6, where="post",
                  label=mode)
        if sims is not None and mode != "default":
            ax_s.step(sims[mode].t, sims[mode].satisfied(), ls=":", lw=1.0, where="post",
                      label=f"simulated {mode}")
    for k, ph in enumerate(phases[DEFAULT_POLICY]):
        ax_s.hlines(ph.oracle_s, ph.start, ph.end, color="black", lw=0.9, ls="-.",
                    label="oracle (best possible)" if k == 0 else None)
    ax_s.set_ylabel("containers in S")
    ax_s.set_ylim(-0.5, len(first.containers) + 0.5)
    ax_s.legend(fontsize=7, loc="lower right")
    for policy in POLICY_NAMES:
        q_g, q_b = runs[policy].gaps()
        (line,) = ax_q.plot(runs[policy].t, q_g, lw=1, label=f"Q_G ({policy})")
        ax_q.plot(runs[policy].t, q_b, lw=1, ls="--", color=line.get_color(),
                  label=f"Q_B ({policy})")
    ax_q.axhline(0, color="black", lw=0.6)
    ax_q.set_ylabel("summed gap q = target - latency (s)")
    ax_q.legend(fontsize=7)
    names = [c.name for c in first.containers]
    for j, policy in enumerate(POLICY_NAMES, start=1):
        r = runs[policy]
        draw_latency(axes[0, j], r.t, r.latency_s / r.targets, names)
        axes[0, j].set_title(policy, fontsize=9)
        ax_cpu = axes[1, j]
        ax_cpu.stackplot(r.t, np.nan_to_num(r.usage_cores).T, labels=names)
        ax_cpu.set_ylabel(f"CPU used, stacked (CPUs), {policy}")
        ax_cpu.set_ylim(0, sum(nd.cpus for nd in r.nodes) * 1.05)
        if len(names) <= 10:
            axes[0, j].legend(fontsize=6, ncol=3, loc="upper right")
            ax_cpu.legend(fontsize=6, ncol=2, loc="lower right")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.set_xlabel("time (s)")
    fig.suptitle(f"{sc.key}: {sc.title}\n{where}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _noise_figure(path: Path, scenarios: list[Scenario], noise: dict[str, dict[str, Any]],
                  ) -> None:
    """Final |S| of each scenario's last phase under noise, per mode: the mean over seeds,
    the range as error bars, the oracle and the bound under noise."""
    fig, ax = plt.subplots(figsize=(max(8.0, 0.9 * len(scenarios)), 4.2))
    x = np.arange(len(scenarios))
    width = 0.8 / len(MODES)
    for j, mode in enumerate(MODES):
        finals = np.array([[_last(per_seed).final_s for per_seed in
                            noise[sc.key]["phases"][mode]] for sc in scenarios], float)
        mean = finals.mean(axis=1)
        ax.bar(x + (j - (len(MODES) - 1) / 2) * width, mean, width, label=mode,
               yerr=[mean - finals.min(axis=1), finals.max(axis=1) - mean], capsize=2)
    last = [_last(noise[sc.key]["phases"][DEFAULT_POLICY][0]) for sc in scenarios]
    ax.scatter(x, [ph.oracle_s for ph in last], marker="_", s=400, color="black", zorder=3,
               label="oracle")
    ax.scatter(x, [sum(ph.bound or ph.oracle) for ph in last], marker="_", s=400,
               color="grey", zorder=3, label="bound under noise")
    ax.set_xticks(x, [sc.key for sc in scenarios], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("final |S| (last phase)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax.set_title("with measurement noise: mean over seeds, range as error bars", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _calibration_figure(path: Path, curves: dict[str, Curve]) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    cores = np.linspace(0.1, 1.0, 50)
    for m, c in curves.items():
        (line,) = left.plot(cores, c.latency(cores), label=f"{m} (model)")
        if c.cores:
            left.plot(c.cores, [c.solo_s / x * f for x, f in zip(c.cores, c.factors,
                                                                  strict=True)],
                      "o", color=line.get_color())
            right.plot(c.cores, c.factors, "o-", color=line.get_color(), label=m)
    left.set_xlabel("CPU share (CPUs)")
    left.set_ylabel("latency (s)")
    left.set_yscale("log")
    left.legend(fontsize=8)
    right.axhline(1.0, color="black", lw=0.6)
    right.set_xlabel("cpu.max quota (CPUs)")
    right.set_ylabel("latency x quota / solo")
    if any(c.cores for c in curves.values()):
        right.legend(fontsize=8)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.suptitle("worker latency against CPU share, measured on the real kernel (dots)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
