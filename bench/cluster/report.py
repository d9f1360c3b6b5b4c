"""The cluster experiment's plots (|S| over time, each way) and summary (summary.md and
summary.json)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from .run import ClusterRun, Outcome, outcome

COLORS = {"default": "tab:gray", "per-node": "tab:blue", "placement": "tab:green"}
STYLES = {None: "-", "dqoes": "-", "admit": "--"}


@dataclass(frozen=True)
class Judged:
    """A scenario's runs with what they are judged against."""

    key: str
    title: str
    where: str  # what ran it, and how
    runs: list[ClusterRun]
    oracle: int  # the cluster oracle: free placement
    spread_oracle: int  # the per-node oracles added up, with Swarm's spread placement
    paper: dict[str, int] | None  # the paper's |S| (dqoes, default), at its scale
    command: str


def plot(judged: Judged, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for run in judged.runs:
        s = run.satisfied()
        ax.plot(run.t, s, STYLES.get(run.policy, "-."), color=COLORS[run.way], lw=1.3,
                label=run.label)
        for m in run.moves:
            ax.axvline(m.at_s, color=COLORS[run.way], alpha=0.15, lw=0.8)
    ax.axhline(judged.oracle, color="black", ls=":", lw=1,
               label=f"cluster oracle, free placement ({judged.oracle})")
    ax.axhline(judged.spread_oracle, color="tab:blue", ls=":", lw=1,
               label=f"per-node oracles, Swarm's spread ({judged.spread_oracle})")
    if judged.paper:
        for way, value in judged.paper.items():
            ax.plot([judged.runs[0].t[-1]], [value], "k*" if way == "dqoes" else "kx", ms=9,
                    label=f"the paper, {way}: {value}")
    last = max(c.arrival_s for c in judged.runs[0].containers)
    ax.axvspan(0, last, color="0.92", zorder=0, label="arrivals")
    n = len(judged.runs[0].containers)
    ax.set(xlabel="time (s)", ylabel=f"containers in S (of {n})", ylim=(0, n + 1),
           title=f"{judged.title}\n({judged.where}; faint lines: moves)")
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out: Path, scenarios: list[Judged]) -> None:
    lines = ["# The paper's cluster experiment, three ways", ""]
    doc = {}
    for judged in scenarios:
        plot(judged, out / f"{judged.key}.png")
        outcomes = [(run, outcome(run)) for run in judged.runs]
        n = len(judged.runs[0].containers)
        lines += [f"## {judged.key}: {judged.title}", "",
                  f"{judged.where}. `{judged.command}`. Plot: {judged.key}.png.", "",
                  f"Cluster oracle (free placement): **{judged.oracle}** of {n}; the "
                  f"per-node oracles with Swarm's spread placement add up to "
                  f"{judged.spread_oracle}."
                  + (f" The paper: {judged.paper['dqoes']} with DQoES, "
                     f"{judged.paper['default']} with Swarm's default, of 40."
                     if judged.paper else ""), "",
                  "| way | per-node policy | \\|S\\| converged | best | converged (s after the "
                  "last arrival) | moves |", "|---|---|---|---|---|---|"]
        for run, o in outcomes:
            lines.append(f"| {run.way} | {run.policy or '-'} | {o.final_s} | {o.best_s} | "
                         f"{_seconds(o.converged_s)} | {o.moves} |")
        lines.append("")
        doc[judged.key] = {
            "title": judged.title, "where": judged.where, "command": judged.command,
            "containers": n, "oracle": judged.oracle, "spread_oracle": judged.spread_oracle,
            "paper": judged.paper,
            "runs": [{"way": run.way, "policy": run.policy, **_outcome_json(o)}
                     for run, o in outcomes]}
    (out / "summary.md").write_text("\n".join(lines))
    (out / "summary.json").write_text(json.dumps(doc, indent=1) + "\n")


def _seconds(x: float | None) -> str:
    return "never" if x is None else f"{x:.0f}"


def _outcome_json(o: Outcome) -> dict[str, object]:
    return asdict(o)
