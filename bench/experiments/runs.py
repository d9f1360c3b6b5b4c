"""Simulated runs of a scenario, on the default platform and with dqoesd under each policy,
and the curves they use (real.calibrate's, saved beside the results)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from dqoes_cg.policy import POLICIES

from .scenarios import NOMINAL_CURVES, Scenario
from .sim import IDEAL, Conditions, Curve, Node, Params, simulate
from .trace import Run

MODES = ("default", *POLICIES)  # how each scenario runs: no limits, then each policy
HELD = "held oracle"  # a run with the oracle's allocation held as caps, no policy
HELD_REAL = "held real oracle"  # ... the real oracle's (analysis.real_caps)
Held = Callable[[Node], Callable[[float, float], np.ndarray]]  # a node's caps at (t, speed)


def save_curves(path: Path, curves: dict[str, Curve]) -> None:
    """Write the curves as JSON (what load_curves reads)."""
    path.write_text(json.dumps({m: asdict(c) for m, c in curves.items()}, indent=1) + "\n")


def load_curves(path: Path) -> dict[str, Curve]:
    """The curves of a calibration (real.calibrate's factors at quotas), or the nominal
    ones where none was measured."""
    if not path.exists():
        return dict(NOMINAL_CURVES)
    return {m: Curve(c["solo_s"], tuple(c["cores"]), tuple(c["factors"]))
            for m, c in json.loads(path.read_text()).items()}


def simulated(scenario: Scenario, nodes: list[Node], curves: dict[str, Curve],
              params: Params | None, duration: float, window: float,
              noise: float = 0.0, seed: int = 0, conditions: Conditions = IDEAL,
              held: tuple[str, Held] | None = None) -> Run:
    """One simulated run of the scenario: with dqoesd (`params`, its policy among them) or
    on the default platform (None), under `conditions`; or (`held`: a mode's name and each
    node's caps, e.g. HELD and analysis.oracle_caps) with an allocation held as caps. Its
    notes keep the noise and each node's drift, window by window."""
    windows = [simulate(node, curves, params, duration, window, noise, 100 * seed + k,
                        conditions, held[1](node) if held else None)
               for k, node in enumerate(nodes)]
    mode = params.policy if params else held[0] if held else "default"
    return Run.from_windows(scenario.key, mode, "sim", asdict(params) if params else {}, nodes,
                            windows, noise=noise, drift=[w.drift.tolist() for w in windows])


def every_mode(scenario: Scenario, nodes: list[Node], curves: dict[str, Curve],
               params: Params, window: float, noise: float = 0.0, seed: int = 0,
               conditions: Conditions = IDEAL) -> dict[str, Run]:
    """The scenario on the default platform and with each policy."""
    return {mode: simulated(scenario, nodes, curves,
                            None if mode == "default" else replace(params, policy=mode),
                            scenario.default_duration_s if mode == "default"
                            else scenario.duration_s, window, noise, seed, conditions)
            for mode in MODES}
