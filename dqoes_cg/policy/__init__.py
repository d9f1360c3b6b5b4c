"""Policies: decide each container's CPU limit from what it measured, chosen by name.

`POLICIES` maps each name (`dqoesd --policy NAME`) to a factory that builds the policy from
the daemon's parameters; `DEFAULT_POLICY` names the daemon's default. The interface between
the loop and a policy is in base.py.

- `dqoes` (dqoes.py): the paper's DQoES, Algorithms 1 and 2, faithfully.
- `admit` (admit.py): each container's need from its work per request, containers admitted
  to S cheapest first within the budget, caps that add up to the budget. The default: in
  the evaluation (bench/experiments) it reaches the best possible |S| in every scenario,
  within three rounds of the last arrival or change, where DQoES takes tens to hundreds of
  rounds and stops short in most (admit.py says why).

These are the policies of inference services. The daemon runs the one named beside FlowCon
(flowcon.py), the policy of training jobs, as one policy (`make_policy`, mixed.py): with
no training job it is the named policy alone.
"""

from __future__ import annotations

from collections.abc import Callable

from .admit import Admit
from .base import (
    ALPHA,
    BETA,
    IV_INITIAL_S,
    IV_MAX_S,
    RHO_MAX,
    T_R,
    Cls,
    Decision,
    FloatArray,
    IndexArray,
    Int8Array,
    Observation,
    Policy,
    PolicyParams,
)
from .dqoes import DQoES, classify
from .flowcon import FlowCon
from .mixed import Mixed

POLICIES: dict[str, Callable[[PolicyParams], Policy]] = {
    "dqoes": DQoES.from_params,
    "admit": Admit.from_params,
}
DEFAULT_POLICY = "admit"


def make_policy(name: str, params: PolicyParams | None = None) -> Policy:
    """The daemon's policy: the inference policy called `name` beside FlowCon, built with
    `params` (the daemon's defaults if None)."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (one of {', '.join(POLICIES)})") from None
    params = params or PolicyParams()
    return Mixed.around(factory(params), params)


__all__ = ["ALPHA", "BETA", "DEFAULT_POLICY", "IV_INITIAL_S", "IV_MAX_S", "POLICIES",
           "RHO_MAX", "T_R", "Admit", "Cls", "DQoES", "Decision", "FloatArray",
           "FlowCon", "IndexArray", "Int8Array", "Mixed", "Observation", "Policy",
           "PolicyParams", "classify", "make_policy"]
