"""A container's QoE target as its labels describe it.

    dqoes.target   the latency target, a duration: 40ms, 1.5s, 250us (an inference service)
    dqoes.metric   the statistic compared with it: mean, p50, p90, p95 (default), p99
    dqoes.policy   flowcon: a training job (no target nor metric), managed by the progress
                   it reports (FlowCon); inference services follow the daemon's --policy
    dqoes.metrics  :PORT/PATH of the service's Prometheus metrics, inside its network
                   namespace (e.g. :8000/metrics): its latencies come from a histogram
                   there instead of its ring, scraped at each window (scrape.py)
    dqoes.histogram  that histogram's name (e.g. request_latency_seconds); with
                   dqoes.metrics, and only with it

On a Swarm service they are service labels (`docker service create --label dqoes.target=2s`,
changed later with `docker service update --label-add`, which recreates no task) or
container labels of its tasks (`--container-label`, fixed when the tasks are created); a
service label wins over the same container label. Labels are hostile input: anything but
these keys under `dqoes.`, or a value they do not accept, leaves the container
unmanaged, with a one-line reason. A pipeline's labels (PIPELINE_KEYS, on Swarm services) are
the cluster manager's: it turns them into a `dqoes.target` per stage.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..duration import parse_duration
from .objective import (
    DEFAULT_METRIC,
    METRICS,
    TRAINING_JOB,
    TRAINING_POLICY,
    Objective,
    check_target,
    scrape_from,
)

PREFIX = "dqoes."
TARGET = "dqoes.target"
METRIC = "dqoes.metric"
POLICY = "dqoes.policy"
METRICS_ENDPOINT = "dqoes.metrics"
HISTOGRAM = "dqoes.histogram"
KNOWN = (TARGET, METRIC, POLICY, METRICS_ENDPOINT, HISTOGRAM)
MAX_VALUE = 64  # characters of a label value worth reading
PIPELINE = "dqoes.pipeline"
NEXT = "dqoes.next"
PIPELINE_TARGET = "dqoes.pipeline.target"
PIPELINE_METRIC = "dqoes.pipeline.metric"
PIPELINE_KEYS = (PIPELINE, NEXT, PIPELINE_TARGET, PIPELINE_METRIC)
"""A pipeline's service labels: read by the cluster's manager (cluster/pipelines.py), which
gives each stage its own target; a container's objective ignores them."""


def ours(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels under `dqoes.`."""
    return {k: v for k, v in labels.items() if k.startswith(PREFIX)}


def objective(labels: Mapping[str, str]) -> Objective | None:
    """The objective that `labels` describe; None when they name none (no `dqoes.` label).
    ValueError, with a one-line reason, when they are malformed."""
    mine = {k: v for k, v in ours(labels).items() if k not in PIPELINE_KEYS}
    if not mine:
        return None
    unknown = sorted(set(mine) - set(KNOWN))
    if unknown:
        raise ValueError(f"unknown label {unknown[0][:64]!r} (known: {', '.join(KNOWN)})")
    if POLICY in mine:
        policy = mine[POLICY]
        if policy != TRAINING_POLICY:
            raise ValueError(f"{POLICY}: unknown policy {policy[:MAX_VALUE]!r} (training "
                             f"jobs: {TRAINING_POLICY}; inference services follow the "
                             "daemon's --policy)")
        if TARGET in mine or METRIC in mine or METRICS_ENDPOINT in mine or HISTOGRAM in mine:
            raise ValueError(f"{POLICY}={TRAINING_POLICY} marks a training job, which has no "
                             f"{TARGET}, {METRIC}, {METRICS_ENDPOINT} or {HISTOGRAM}")
        return TRAINING_JOB
    if TARGET not in mine:
        raise ValueError(f"{next(k for k in KNOWN if k in mine)} without {TARGET}")
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
    try:
        scrape = scrape_from(mine.get(METRICS_ENDPOINT), mine.get(HISTOGRAM))
    except ValueError as e:
        raise ValueError(f"{METRICS_ENDPOINT}, {HISTOGRAM}: {e}") from None
    return Objective(target_s, metric, scrape=scrape)


def effective(container: Mapping[str, str], service: Mapping[str, str] | None
              ) -> tuple[dict[str, str], str]:
    """The `dqoes.` labels that apply to a container, and where its target comes from:
    "service" when its service's labels name one or a policy (they win, key by key), else
    "label"."""
    mine = ours(container)
    theirs = ours(service or {})
    source = "service" if TARGET in theirs or POLICY in theirs else "label"
    return {**mine, **theirs}, source
