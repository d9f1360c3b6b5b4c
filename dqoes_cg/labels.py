"""A container's QoE target as its labels describe it.

    dqoes.target   the latency target, a duration: 40ms, 1.5s, 250us (required)
    dqoes.metric   the statistic compared with it: mean, p50, p90, p95 (default), p99

On a Swarm service they are service labels (`docker service create --label dqoes.target=2s`,
changed later with `docker service update --label-add`, which recreates no task) or
container labels of its tasks (`--container-label`, fixed when the tasks are created); a
service label wins over the same container label. Labels are hostile input: anything but
these two keys under `dqoes.`, or a value they do not accept, leaves the container
unmanaged, with a one-line reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .duration import parse_duration
from .state import METRICS, check_target

PREFIX = "dqoes."
TARGET = "dqoes.target"
METRIC = "dqoes.metric"
KNOWN = (TARGET, METRIC)
DEFAULT_METRIC = "p95"
MAX_VALUE = 64  # characters of a label value worth reading


@dataclass(frozen=True)
class Objective:
    target_s: float
    metric: str


def ours(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels under `dqoes.`."""
    return {k: v for k, v in labels.items() if k.startswith(PREFIX)}


def objective(labels: Mapping[str, str]) -> Objective | None:
    """The objective that `labels` describe; None when they name none (no `dqoes.` label).
    ValueError, with a one-line reason, when they are malformed."""
    mine = ours(labels)
    if not mine:
        return None
    unknown = sorted(set(mine) - set(KNOWN))
    if unknown:
        raise ValueError(f"unknown label {unknown[0][:64]!r} (known: {', '.join(KNOWN)})")
    if TARGET not in mine:
        raise ValueError(f"{METRIC} without {TARGET}")
    text = mine[TARGET]
    if len(text) > MAX_VALUE:
        raise ValueError(f"{TARGET} is longer than {MAX_VALUE} characters")
    try:
        target_s = parse_duration(text)
    except ValueError as e:
        raise ValueError(f"{TARGET}: {e}") from None
    metric = mine.get(METRIC, DEFAULT_METRIC)
    if metric not in METRICS:
        raise ValueError(f"{METRIC}: unknown metric {metric[:MAX_VALUE]!r} (one of "
                         f"{', '.join(METRICS)})")
    try:
        check_target(target_s, metric)
    except ValueError as e:
        raise ValueError(f"{TARGET}: {e}") from None
    return Objective(target_s, metric)


def effective(container: Mapping[str, str], service: Mapping[str, str] | None
              ) -> tuple[dict[str, str], str]:
    """The `dqoes.` labels that apply to a container, and where its target comes from:
    "service" when its service's labels name one (they win, key by key), else "label"."""
    mine = ours(container)
    theirs = ours(service or {})
    source = "service" if TARGET in theirs else "label"
    return {**mine, **theirs}, source
