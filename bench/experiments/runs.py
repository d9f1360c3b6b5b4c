"""Simulated runs of a scenario, on the default platform and with dqoesd under each policy,
and the curves they use (real.calibrate's, saved beside the results)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

from dqoes_cg.policy import POLICIES

from .analysis import oracle_caps
from .scenarios import NOMINAL_CURVES, Scenario
from .sim import IDEAL, Conditions, Curve, Node, Params, simulate
from .trace import Run

MODES = ("default", *POLICIES)  # how each scenario runs: no limits, then each policy
HELD = "held oracle"  # a run with the oracle's allocation held as caps, no policy


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
              held: bool = False) -> Run:
    """One simulated run of the scenario: with dqoesd (`params`, its policy among them) or
    on the default platform (None), under `conditions`; or (`held`) with the oracle's
    allocation at each time held as caps (mode HELD)."""
    windows = [simulate(node, curves, params, duration, window, noise, 100 * seed + k,
                        conditions, oracle_caps(node, curves) if held else None)
               for k, node in enumerate(nodes)]
    mode = params.policy if params else HELD if held else "default"
    return Run.from_windows(scenario.key, mode, "sim", asdict(params) if params else {}, nodes,
                            windows, noise=noise)


def every_mode(scenario: Scenario, nodes: list[Node], curves: dict[str, Curve],
               params: Params, window: float, noise: float = 0.0, seed: int = 0,
               conditions: Conditions = IDEAL) -> dict[str, Run]:
    """The scenario on the default platform and with each policy."""
    return {mode: simulated(scenario, nodes, curves,
                            None if mode == "default" else replace(params, policy=mode),
                            scenario.default_duration_s if mode == "default"
                            else scenario.duration_s, window, noise, seed, conditions)
            for mode in MODES}
