"""Labels as targets (membership/labels.py): what a container's creator writes is hostile input."""

from __future__ import annotations

import pytest

from dqoes_cg.membership.labels import effective, objective
from dqoes_cg.membership.objective import Objective, Scrape


def test_a_target_and_a_metric() -> None:
    assert objective({"dqoes.target": "40ms", "dqoes.metric": "p99"}) == Objective(0.04, "p99")
    assert objective({"dqoes.target": "1.5s", "other": "x"}) == Objective(1.5, "p95")
    assert objective({"maintainer": "me"}) is None  # not ours: no target, no error


def test_latencies_from_the_service_s_own_histogram() -> None:
    o = objective({"dqoes.target": "40ms", "dqoes.metrics": ":8000/metrics",
                   "dqoes.histogram": "request_latency_seconds"})
    assert o == Objective(0.04, "p95", scrape=Scrape(":8000/metrics", "request_latency_seconds"))
    assert (o.scrape.port, o.scrape.path) == (8000, "/metrics")


@pytest.mark.parametrize(("labels", "reason"), [
    ({"dqoes.target": "fast"}, "dqoes.target: bad duration 'fast'"),
    ({"dqoes.target": "-5ms"}, "dqoes.target: bad duration '-5ms'"),
    ({"dqoes.target": "40"}, "use a number and a unit"),
    ({"dqoes.target": "0ms"}, "at least 1us"),
    ({"dqoes.target": "2h"}, "bad duration"),
    ({"dqoes.target": "5000s"}, "at most 3600 s"),
    ({"dqoes.target": "9" * 400 + "s"}, "longer than 64 characters"),
    ({"dqoes.target": "40ms", "dqoes.metric": "p42"}, "unknown metric 'p42'"),
    ({"dqoes.metric": "p95"}, "dqoes.metric without dqoes.target"),
    ({"dqoes.histogram": "h"}, "dqoes.histogram without dqoes.target"),
    ({"dqoes.target": "1s", "dqoes.metrics": ":8000/metrics"}, "go together"),
    ({"dqoes.target": "1s", "dqoes.histogram": "h"}, "go together"),
    ({"dqoes.target": "1s", "dqoes.metrics": "8000/metrics", "dqoes.histogram": "h"},
     "is not :PORT/PATH"),
    ({"dqoes.target": "1s", "dqoes.metrics": ":99999/metrics", "dqoes.histogram": "h"},
     "port out of range"),
    ({"dqoes.target": "1s", "dqoes.metrics": ":80/a b\r\nX: y", "dqoes.histogram": "h"},
     "is not :PORT/PATH"),
    ({"dqoes.target": "1s", "dqoes.metrics": ":80/m", "dqoes.histogram": "a-b"},
     "not a metric name"),
    ({"dqoes.policy": "flowcon", "dqoes.metrics": ":80/m", "dqoes.histogram": "h"},
     "marks a training job"),
    ({"dqoes.target": "40ms", "dqoes.targte": "1s"}, "unknown label 'dqoes.targte'"),
])
def test_malformed_labels_say_why_in_one_line(labels: dict[str, str], reason: str) -> None:
    with pytest.raises(ValueError) as e:
        objective(labels)
    assert reason in str(e.value) and "\n" not in str(e.value)
    assert len(str(e.value)) < 200


def test_a_service_label_wins_over_the_container_label() -> None:
    task = {"dqoes.target": "2s", "com.docker.swarm.service.id": "s1"}
    assert effective(task, None) == ({"dqoes.target": "2s"}, "label")
    assert effective(task, {"dqoes.target": "1s", "team": "x"}) == \
        ({"dqoes.target": "1s"}, "service")
    assert effective(task, {"dqoes.metric": "mean"}) == \
        ({"dqoes.target": "2s", "dqoes.metric": "mean"}, "label")
