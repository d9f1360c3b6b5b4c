"""Plots (PNG, like the paper's figures) and the summary (summary.md, summary.json)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from lab.demo import draw_latency

from .analysis import Agreement, agreement, default_satisfied, oracle, outcome
from .scenarios import PAPER_PARAMS, REAL_PARAMS, Scenario
from .sim import Curve, Params
from .trace import Run

S_TOLERANCE = 1  # containers: simulated and real final |S| agree within this
SHARE_TOLERANCE = 0.10  # CPUs: mean |difference| of the converged CPU shares
WIDE_ALPHA = 0.25  # real runs counted again with a band wider than the host's speed swings
COMMAND = "python -m bench.experiments"


def write(out: Path, measured: dict[str, Curve], curves: dict[str, Curve],
          papers: list[Scenario],
          paper_runs: dict[str, dict[str, Any]], reals: list[Scenario],
          real_runs: dict[str, dict[str, Any]], quick: bool) -> None:
    paper_rows = [_paper_row(sc, paper_runs[sc.key], curves) for sc in papers]
    for sc in papers:
        runs = paper_runs[sc.key]
        _figure(out / f"{sc.key}.png", sc, runs["dqoes"], runs["default"], None,
                f"simulated, dqoesd's defaults ({_params(PAPER_PARAMS)})",
                [oracle(nd, curves) for nd in runs["dqoes"].nodes])
    real_rows = []
    for sc in reals:
        runs = real_runs.get(sc.key)
        if runs is None:
            continue
        real_rows.append(_real_row(sc, runs))
        _figure(out / f"{sc.key}.png", sc, runs["dqoes"], runs["default"], runs["sim-dqoes"],
                f"real kernel (qemu guest, 2 vCPUs), {_params(REAL_PARAMS)}",
                [oracle(nd, runs["curves"]) for nd in runs["dqoes"].nodes])
    _calibration_figure(out / "calibration.png", measured)
    sweep = {sc.key: {f"beta={b:g} iv_max={iv:g}": outcome(r).final_s
                      for (b, iv), r in paper_runs[sc.key]["sweep"].items()} for sc in papers}
    (out / "summary.json").write_text(json.dumps(
        {"command": COMMAND + " --quick" * quick, "paper_params": asdict(PAPER_PARAMS),
         "real_params": asdict(REAL_PARAMS),
         "calibration": {m: asdict(c) for m, c in measured.items()},
         "paper_scale": paper_rows, "real": real_rows, "sweep": sweep}, indent=1) + "\n")
    (out / "summary.md").write_text(_markdown(paper_rows, real_rows, sweep, measured, quick))


def _params(p: Params) -> str:
    return (f"alpha {p.alpha:g}, beta {p.beta:g}, IV {p.iv_initial:g}-{p.iv_max:g} s, "
            f"tick {p.sample_interval:g} s")


def _paper_row(sc: Scenario, runs: dict[str, Any], curves: dict[str, Curve]) -> dict[str, Any]:
    d, base = outcome(runs["dqoes"]), outcome(runs["default"])
    nodes = runs["dqoes"].nodes
    return {"scenario": sc.key, "title": sc.title, "containers": sc.size, "paper": sc.paper,
            "oracle": sum(oracle(nd, curves) for nd in nodes),
            "dqoes_s": d.final_s, "dqoes_reached_s": d.reached_s,
            "default_s": base.final_s, "duration_s": float(runs["dqoes"].t[-1]),
            "default_predicted": sum(default_satisfied(nd, curves) for nd in nodes)}


def _real_row(sc: Scenario, runs: dict[str, Any]) -> dict[str, Any]:
    d, base = outcome(runs["dqoes"]), outcome(runs["default"])
    a: Agreement = agreement(runs["dqoes"], runs["sim-dqoes"])
    b: Agreement = agreement(runs["default"], runs["sim-default"])
    ok = a.within(S_TOLERANCE, SHARE_TOLERANCE) and b.within(S_TOLERANCE, SHARE_TOLERANCE)
    return {"scenario": sc.key, "title": sc.title, "containers": sc.size,
            "oracle": sum(oracle(nd, runs["curves"]) for nd in runs["dqoes"].nodes),
            "dqoes_s": d.final_s, "dqoes_reached_s": d.reached_s, "default_s": base.final_s,
            "dqoes_s_25": outcome(runs["dqoes"], WIDE_ALPHA).final_s,
            "default_s_25": outcome(runs["default"], WIDE_ALPHA).final_s,
            "sim_dqoes_s": a.sim_s, "sim_default_s": b.sim_s,
            "sim_quiet_s": outcome(runs["sim-quiet"]).final_s,
            "share_error_dqoes": a.share_error, "share_error_default": b.share_error,
            "agrees": ok}


def _reached(final: int, seconds: float | None) -> str:
    if final == 0:
        return str(final)
    return f"{final} ({'never held' if seconds is None else f'{seconds:.0f} s'})"


def _markdown(paper_rows: list[dict[str, Any]], real_rows: list[dict[str, Any]],
              sweep: dict[str, dict[str, int]], curves: dict[str, Curve], quick: bool) -> str:
    lines = [
        "# Evaluation: the paper's experiments (section V)", "",
        f"Made by `{COMMAND}{' --quick' * quick}` (see bench/experiments/__main__.py). "
        "|S| is the number of containers within alpha = 10% of their target, final = the "
        "median over the last 15% of the run; 'reached' = when |S| first held that level. "
        "The oracle is the most containers that can be in S at once given the CPUs, each "
        "container's latency curve and DQoES's floor of 1/(2n) of the budget per container. "
        "The default platform sets no limits: CFS's even share.", "",
        "## The paper's scenarios at its scale (simulated)", "",
        f"Simulated 2-CPU nodes, 10 containers each; dqoesd's defaults, which are the "
        f"paper's alpha, beta and IV_initial with a ceiling of the interval (the paper "
        f"gives none): {_params(PAPER_PARAMS)}; runs of "
        f"{max((r['duration_s'] for r in paper_rows), default=0):.0f} simulated seconds.", "",
        "| scenario | n | paper | oracle | dqoes-cg final \\|S\\| (reached) | default \\|S\\| |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['scenario']}: {r['title']} | {r['containers']} | {r['paper']} | "
              f"{r['oracle']} | {_reached(r['dqoes_s'], r['dqoes_reached_s'])} | "
              f"{r['default_s']} |" for r in paper_rows]
    keys = list(next(iter(sweep.values())).keys()) if sweep else []
    lines += ["", "## Sensitivity: final |S| against the step beta and the listener's "
              "ceiling iv_max (simulated, alpha 0.1, IV_initial 10 s)", "",
              "| scenario | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    lines += [f"| {k} | " + " | ".join(str(v[c]) for c in keys) + " |"
              for k, v in sweep.items()]
    lines += _comparison(paper_rows, real_rows, sweep)
    lines += ["", "## Real runs (qemu guest: real kernel, 2 emulated CPUs) and the "
              "simulator's validation", "",
              f"Scaled to 2 CPUs (4 to 6 containers); {_params(REAL_PARAMS)}. The simulator "
              "runs the same containers, targets and arrivals. It agrees when the final |S| "
              f"is within {S_TOLERANCE} and the converged CPU shares within "
              f"{SHARE_TOLERANCE:g} CPU on average, for both dqoes-cg and the default.", "",
              "The emulated CPUs' speed swings within a run whenever other work shares the "
              "host's 2 cores, at times by more than the 10% band, so the real |S| is also "
              f"counted within {WIDE_ALPHA:.0%} of the targets (the daemon still used 10%). "
              "The simulator is given each real run's scatter (the standard deviation of its "
              "log latency over the converged tail); the last column is the same simulation "
              "without it: the same controller on a kernel whose speed holds still.",
              "",
              "| scenario | n | oracle | real dqoes-cg (reached) | real default | within "
              f"{WIDE_ALPHA:.0%}: dqoes-cg / default | sim dqoes-cg | sim default | share error "
              "dqoes / default (CPU) | agrees | sim dqoes-cg without scatter |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['scenario']}: {r['title']} | {r['containers']} | {r['oracle']} | "
              f"{_reached(r['dqoes_s'], r['dqoes_reached_s'])} | {r['default_s']} | "
              f"{r['dqoes_s_25']} / {r['default_s_25']} | {r['sim_dqoes_s']} | "
              f"{r['sim_default_s']} | {r['share_error_dqoes']:.3f} / "
              f"{r['share_error_default']:.3f} | {'yes' if r['agrees'] else 'no'} | "
              f"{r['sim_quiet_s']} |"
              for r in real_rows]
    if not real_rows:
        lines.append("| (no real runs in this results directory) |||||||||||")
    lines += ["", "## Calibration (calibration.json, calibration.png)", "",
              "Each worker type alone at a few cpu.max quotas, with the other CPU kept busy: "
              "latency x quota / solo latency (1 = latency inversely proportional to the "
              "CPU share). The simulator takes latency = solo / share, and each real "
              "scenario's own default run sets the speed its simulation uses (its even-share "
              "latencies); where a factor departs from 1, the simulated curve is off by that "
              "much at that share, and the validation above shows what it costs.", "",
              "| model | solo latency | " +
              " | ".join(f"at {c:g} CPU" for c in next(iter(curves.values())).cores) + " |",
              "|---" * (2 + len(next(iter(curves.values())).cores)) + "|"]
    lines += [f"| {m} | {c.solo_s * 1e3:.0f} ms | " + " | ".join(f"{f:.2f}" for f in c.factors)
              + " |" for m, c in curves.items()]
    lines += ["", "Figures: `<scenario>.png` (|S| over time, Q_G and Q_B, CPU distribution, "
              "latency / target), `calibration.png`.", ""]
    return "\n".join(lines)


def _comparison(paper_rows: list[dict[str, Any]], real_rows: list[dict[str, Any]],
                sweep: dict[str, dict[str, int]]) -> list[str]:
    """The closing note: each of the paper's claims against what was measured here."""
    sim = {r["scenario"]: r for r in paper_rows}
    real = {r["scenario"]: r for r in real_rows}

    def got(rows: dict[str, dict[str, Any]], key: str) -> str:
        r = rows.get(key)
        if r is None:
            return "not run"
        return (f"{r['dqoes_s']}/{r['containers']} in S (default {r['default_s']}, "
                f"oracle {r['oracle']})")

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
             "| the paper | simulated, dqoesd's defaults | best in the sweep | real (scaled) |",
             "|---|---|---|---|"]
    lines += [f"| {claim} | {got(sim, s_key)} | {best(s_key)} | {got(real, r_key)} |"
              for claim, s_key, r_key in claims]
    return lines


def _figure(path: Path, sc: Scenario, run: Run, default: Run, sim: Run | None, where: str,
            oracles: list[int]) -> None:
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    (ax_s, ax_q), (ax_cpu, ax_lat) = axes
    multi = len(run.nodes) > 1
    for label, r, style in (("dqoes-cg", run, "-"), ("default", default, "--"),
                            ("simulated dqoes-cg", sim, ":")):
        if r is None:
            continue
        if multi:
            cls_s = r.classes() == 2
            for k in range(len(r.nodes)):
                ax_s.plot(r.t, cls_s[:, r.node_of == k].sum(axis=1), ls=style, lw=1,
                          label=f"{label}, worker {k + 1}")
        ax_s.step(r.t, r.satisfied(), ls=style, lw=1.8, where="post",
                  label=f"{label}{', all workers' if multi else ''}")
    ax_s.axhline(sum(oracles), color="black", lw=0.8, ls="-.", label="oracle (best possible)")
    ax_s.set_ylabel("containers in S")
    ax_s.set_ylim(-0.5, run.targets.size + 0.5)
    ax_s.legend(fontsize=7, loc="upper left")
    q_g, q_b = run.gaps()
    ax_q.plot(run.t, q_g, color="tab:blue", label="Q_G (dqoes-cg)")
    ax_q.plot(run.t, q_b, color="tab:red", label="Q_B (dqoes-cg)")
    ax_q.axhline(0, color="black", lw=0.6)
    ax_q.set_ylabel("summed gap q = target - latency (s)")
    ax_q.legend(fontsize=7)
    names = [c.name for c in run.containers]
    ax_cpu.stackplot(run.t, np.nan_to_num(run.usage_cores).T, labels=names)
    ax_cpu.set_ylabel("CPU used, stacked (CPUs)")
    ax_cpu.set_ylim(0, sum(nd.cpus for nd in run.nodes) * 1.05)
    if len(names) <= 10:
        ax_cpu.legend(fontsize=6, ncol=2, loc="lower right")
    draw_latency(ax_lat, run.t, run.latency_s / run.targets, names)
    if len(names) <= 10:
        ax_lat.legend(fontsize=6, ncol=3, loc="upper right")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.set_xlabel("time (s)")
    fig.suptitle(f"{sc.key}: {sc.title}\n{where}", fontsize=10)
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
