"""Policies: decide each container's CPU limit from what it measured, chosen by name.

`POLICIES` maps each name (`dqoesd --policy NAME`) to a factory that builds the policy from
the daemon's parameters; `DEFAULT_POLICY` names the daemon's default. The interface between
the loop and a policy is in base.py.

These are the policies of inference services. The daemon runs the one named beside FlowCon
(flowcon.py), the policy of training jobs, as one policy (`make_policy`, mixed.py): with
no training job it is the named policy alone.
"""

from __future__ import annotations

from collections.abc import Callable

from .base import (
    ALPHA,
    BETA,
    IV_INITIAL_S,
    IV_MAX_S,
    T_R,
    Cls,
    Decision,
    FloatArray,
    Int8Array,
    Observation,
    Policy,
    PolicyParams,
)
from .dqoes import DQoES, classify
from .flowcon import TRAINING_POLICY, FlowCon
from .mixed import Mixed

POLICIES: dict[str, Callable[[PolicyParams], Policy]] = {
    "dqoes": DQoES.from_params,
}
DEFAULT_POLICY = "dqoes"


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
           "TRAINING_POLICY", "T_R", "Cls", "DQoES", "Decision", "FloatArray", "FlowCon",
           "Int8Array", "Mixed", "Observation", "Policy", "PolicyParams", "classify",
           "make_policy"]
