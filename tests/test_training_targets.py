"""Training jobs through the daemon's interfaces, on the host: the state keeps their kind,
labels mark them (dqoes.policy=flowcon), the controller carries their reports to the policy
and their lists, evaluation values and growth efficiencies to the status, the JSON and the
metrics; dqoesctl sets, lists and shows them against a running dqoesd (a fake cgroup tree:
the interface, not the kernel, which test_flowcon_kernel.py covers)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from dqoes_cg.ctl import format_status
from dqoes_cg.membership.labels import effective, objective
from dqoes_cg.membership.objective import (
    INFERENCE,
    TRAINING,
    TRAINING_JOB,
    Objective,
    Target,
    check_target,
)
from dqoes_cg.membership.targets import TargetError
from dqoes_cg.metrics import render
from dqoes_cg.policy import make_policy
from dqoes_cg.probe import Probe
from dqoes_cg.state import STATE_VERSION, StateStore
from dqoes_cg.status import Status
from lab.fakecg import CPU_STAT, write
from tests.test_controller import Host
from tests.test_ctl import Daemon, daemon  # noqa: F401 (the fixture)
from tests.test_engine_targets import StubWatcher, seen

# --- the state ---------------------------------------------------------------------------


def test_a_training_job_round_trips_through_the_state(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.load()
    job = Target("train", None, None, cgroup="/sys/fs/cgroup/train", kind=TRAINING)
    web = Target("web", 0.04, "p95")
    store.put(job, web)
    assert StateStore(tmp_path).load() == {"train": job, "web": web}  # from the log
    store.compact({"train": job, "web": web})
    doc = json.loads((tmp_path / "state.json").read_text())
    assert doc["version"] == STATE_VERSION
    assert StateStore(tmp_path).load()["train"].kind == TRAINING  # from the snapshot


def test_a_version_2_state_is_read_as_inference_services(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(json.dumps({"version": 2, "targets": [
        {"name": "web", "target_s": 0.04, "metric": "p95", "source": "cli"}]}))
    assert StateStore(tmp_path).load()["web"].kind == INFERENCE


@pytest.mark.parametrize(("target_s", "metric", "kind"), [
    (0.04, None, TRAINING), (None, "p95", TRAINING), (None, None, INFERENCE),
    (None, None, "batch")])
def test_the_kind_and_the_objective_must_agree(target_s: float | None, metric: str | None,
                                               kind: str) -> None:
    with pytest.raises(ValueError):
        check_target(target_s, metric, kind)


# --- labels ------------------------------------------------------------------------------


def test_the_flowcon_label_marks_a_training_job() -> None:
    assert objective({"dqoes.policy": "flowcon"}) == TRAINING_JOB
    assert str(TRAINING_JOB) == "a training job (flowcon)"
    assert str(Objective(0.04, "p95")) == "target 40.0ms (p95)"
    labels, source = effective({}, {"dqoes.policy": "flowcon"})
    assert source == "service" and objective(labels) == TRAINING_JOB


@pytest.mark.parametrize(("labels", "reason"), [
    ({"dqoes.policy": "dqoes"}, "unknown policy 'dqoes'"),
    ({"dqoes.policy": "flowcon", "dqoes.target": "40ms"}, "has no dqoes.target"),
    ({"dqoes.policy": "flowcon", "dqoes.metric": "p95"}, "has no dqoes.target"),
])
def test_a_bad_policy_label_says_why(labels: dict[str, str], reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as e:
        objective(labels)
    assert "\n" not in str(e.value)


# --- the controller ----------------------------------------------------------------------


def _usage(cgroup: Path, usec: int) -> None:
    write(cgroup / "cpu.stat", CPU_STAT.replace("usage_usec 1000", f"usage_usec {usec}"))


def test_a_training_job_is_decided_by_flowcon_beside_a_service(tmp_path: Path) -> None:
    host = Host(tmp_path)
    a, b = "docker/" + "a" * 64, "docker/" + "b" * 64
    c = host.controller(make_policy("dqoes"))  # type: ignore[arg-type]
    c.set_target(a, Objective(0.1, "mean"), False)
    listed = c.set_target(b, TRAINING_JOB, False)
    assert (listed.kind, listed.target_s, listed.metric) == (TRAINING, None, None)
    now = time.monotonic()
    c.tick(now)
    with Probe.open(c.rings.path(b)) as probe:
        for loss in (2.0, 1.5, 1.25):
            probe.progress(loss)
        _usage(host.b, 1000 + 500_000)  # half a CPU over the second
        c.policy.reset()
        c.tick(now + 1.0)
        obs = c.fleet.obs
        assert obs.training is not None and obs.training.tolist() == [False, True]
        assert np.isnan(obs.target[1]) and obs.eval_last[1] == 1.25
        assert obs.eval_prev[1] == 2.0  # its first report: none before the window
        probe.progress(1.0)
        _usage(host.b, 1000 + 1_000_000)
        c.policy.reset()
        c.tick(now + 2.0)
        assert obs.eval_prev[1] == 1.25 and obs.eval_last[1] == 1.0  # from the last one on
    status = c.status()
    job = next(s for s in status.containers if s.name == b)
    assert (job.kind, job.cls, job.evaluation) == (TRAINING, "NL", 1.0)
    assert job.growth_efficiency is not None and job.growth_efficiency > 0
    assert job.cpu_limit_cores is not None and job.cpu_limit_cores > 0
    assert status.host.NL == 1 and status.host.policy == "dqoes+flowcon"
    assert "training_budget" in status.host.totals
    c.shutdown()


def test_a_target_becomes_a_training_job_and_back(tmp_path: Path) -> None:
    host = Host(tmp_path)
    a = "docker/" + "a" * 64
    c = host.controller(make_policy("dqoes"))  # type: ignore[arg-type]
    c.set_target(a, Objective(0.1, "mean"), False)
    c.tick(time.monotonic())
    c.set_target(a, TRAINING_JOB, False)
    assert c.fleet.training.tolist() == [True] and np.isnan(c.fleet.target_s[0])
    c.set_target(a, Objective(0.2, "p95"), False)
    assert c.fleet.training.tolist() == [False] and c.fleet.target_s[0] == 0.2
    with pytest.raises(TargetError, match="no latency target"):
        c.set_target(a, Objective(0.2, "p95", TRAINING), False)
    c.shutdown()


def test_labels_make_a_training_job_and_change_it(tmp_path: Path) -> None:
    host = Host(tmp_path)
    w = StubWatcher()
    c = host.controller()
    c.engine_targets.watcher = w
    cid = "a" * 64
    job = seen(host, cid, "trainer")
    job = type(job)(job.id, job.name, TRAINING_JOB, job.source, None, job.cgroup, None)
    w.report(job, listed=True)
    c.tick(time.monotonic())
    (listed,) = c.listings()
    assert (listed.name, listed.kind, listed.target_s, listed.source) == (
        "trainer", TRAINING, None, "label")
    w.report(seen(host, cid, "trainer", target=0.3))  # the label changed to a target
    c.tick(time.monotonic())
    (listed,) = c.listings()
    assert (listed.kind, listed.target_s) == (INFERENCE, 0.3)
    c.shutdown()


# --- status, JSON and metrics ------------------------------------------------------------


def test_status_json_and_metrics_carry_the_lists() -> None:
    doc = {
        "host": {"G": 0, "S": 1, "B": 0, "idle": 0, "pending": 0, "NL": 1, "WL": 0, "CL": 1,
                 "policy": "dqoes+flowcon", "interval_s": 10.0, "last_decision_age_s": 1.0,
                 "last_decision_unix": 1.7e9, "budget_cpus": 2.0, "ticks": 9, "decisions": 2,
                 "reconcile_corrections": 0, "ring_faults": 0, "ring_lost": 0,
                 "totals": {"threshold": 0.5, "training_budget": 0.6}},
        "containers": [
            {"name": "web", "class": "S", "target_s": 0.04, "metric": "p95",
             "measured_s": 0.041, "q_s": -0.001, "cpu_limit_cores": 0.8,
             "cpu_usage_cores": 0.79, "throttled_ratio": 0.5, "samples": 40, "cgroup": None,
             "ring": "/run/dqoes/rings/web/ring"},
            {"name": "resnet-train", "class": "NL", "target_s": None, "metric": None,
             "measured_s": None, "q_s": None, "cpu_limit_cores": 0.9, "cpu_usage_cores": 0.88,
             "throttled_ratio": 0.2, "samples": 0, "cgroup": None, "ring": "/x",
             "kind": "training", "evaluation": 0.73, "growth_efficiency": 0.0125},
            {"name": "vae-train", "class": "CL", "target_s": None, "metric": None,
             "measured_s": None, "q_s": None, "cpu_limit_cores": 0.3, "cpu_usage_cores": 0.3,
             "throttled_ratio": 0.9, "samples": 0, "cgroup": None, "ring": "/y",
             "kind": "training", "evaluation": 101.5, "growth_efficiency": None},
        ]}
    status = Status.from_json(doc)
    assert Status.from_json(status.to_json()) == status
    text = render(status)[0].decode()
    assert 'dqoes_container_class{class="NL",container="resnet-train"} 1.0' in text
    assert 'dqoes_container_evaluation{container="resnet-train"} 0.73' in text
    assert 'dqoes_container_growth_efficiency{container="vae-train"} NaN' in text
    assert 'dqoes_containers{class="CL"} 1.0' in text
    assert 'dqoes_container_target_seconds{container="vae-train"' not in text
    table = format_status(status)
    assert "TRAINING JOB" in table and "resnet-train  NL" in table
    assert "NL 1  WL 0  CL 1" in table


# --- dqoesctl against dqoesd -------------------------------------------------------------


def test_dqoesctl_sets_lists_and_shows_a_training_job(daemon: Daemon) -> None:  # noqa: F811
    r = daemon.ctl("set-target", "pods/batch", "--training")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("pods/batch: a training job, bound to ")
    (listed,) = json.loads(daemon.ctl("list", "--json").stdout)
    assert (listed["kind"], listed["target_s"], listed["metric"]) == ("training", None, None)
    assert "training" in daemon.ctl("list").stdout
    row = json.loads(daemon.ctl("status", "--json").stdout)["containers"][0]
    assert row["kind"] == "training" and "evaluation" in row and "growth_efficiency" in row
    assert "TRAINING JOB" in daemon.ctl("status").stdout
    for args, message in ((("set-target", "pods/web", "40ms", "--training"), "no target"),
                          (("set-target", "pods/web", "--metric", "p95", "--training"),
                           "no target"),
                          (("set-target", "pods/web"), "needs a TARGET")):
        r = daemon.ctl(*args)
        assert r.returncode == 1 and r.stdout == "" and message in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    assert len(json.loads(daemon.ctl("list", "--json").stdout)) == 1
    # a training job survives a restart with its kind
    daemon.stop()
    daemon.start()
    (listed,) = json.loads(daemon.ctl("list", "--json").stdout)
    assert listed["kind"] == "training"
