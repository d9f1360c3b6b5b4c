"""dqoesd on a real cgroup v2 kernel, with a service it measures by the Prometheus histogram
the service exports (scraped in the service's own network namespace) beside a worker that
reports through its ring: both held in S.

On 2 CPUs: an inference service (lab.metrics_service: prometheus_client's Histogram and
HTTP server, its requests arriving at random, in a cgroup and a network namespace of its
own) and a
back-to-back worker (lab.workload). Unlimited, the worker takes a CPU and the service what
it needs: the service's target is three times its mean latency then, the worker's its
latency at half a CPU; the daemon must take CPU from both, each down to what its target needs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from dqoes_cg.ctl import format_status
from dqoes_cg.histogram import MEAN, Reading, Window, window
from dqoes_cg.membership.objective import Scrape
from dqoes_cg.scrape import Job, ScrapeError, scrape
from dqoes_cg.status import ContainerStatus
from lab import testbed
from lab.metrics_service import LATENCY
from lab.shell import wait_for

pytestmark = pytest.mark.kernel

PORT = 8000
PERIOD = 100_000
HALF_CPU = PERIOD // 2
ENDPOINT = f":{PORT}/metrics"


def test_a_service_measured_by_its_own_histogram_beside_a_ring_one_both_held_in_s(
        tmp_path: Path, record_property: pytest.RecordProperty) -> None:
    cpus = os.cpu_count() or 1
    if cpus != 2:
        pytest.skip(f"the scenario is sized for 2 CPUs, this kernel has {cpus}")
    # A few requests a second (0.06 CPU of the model's work alone; beside a busy worker and
    # woken by each arrival a request costs the emulated CPU 3 to 5 times that: at 0.15,
    # 8 a second, the service needed 0.8 CPU, and its queue grew whenever a limit came near
    # that), over windows of 6 to 12 s, so that each has a few dozen.
    rate = 0.06 / testbed.solo_latency("micro")
    with testbed.Testbed(f"dqoes-test-{os.getpid()}", tmp_path) as bed:
        bed.add_metrics_service("svc", "micro", rate, PORT)
        bed.add_worker("w1", "tiny")
        svc = Job(f"{bed.subtree}/svc", str(bed.root / "svc"), Scrape(ENDPOINT, LATENCY),
                  "mean")

        def reading() -> Reading | None:
            try:
                return scrape(svc, bed.mount, timeout=5.0)
            except ScrapeError:
                return None

        # The service's mean latency from its own histogram (the scrape enters its network
        # namespace, as the daemon's does), unlimited; the worker's latency at half a CPU,
        # measured under a cap of half a CPU (on the emulated CPU a request costs more under a
        # cap than unlimited: 61 ms of CPU unlimited, 119 ms at a cap of 0.82, where the
        # target derived from the first was out of reach).
        wait_for(reading, 300, "the service's histogram, in its network namespace", every=1.0)
        (bed.root / "w1" / "cpu.max").write_text(f"{HALF_CPU} {PERIOD}")
        observer = bed.observer(["w1"])
        try:
            waited = served = 0.0
            started = False
            deadline = time.monotonic() + 300
            while served < 30:  # from the windows after its first request (start-up left out)
                assert time.monotonic() < deadline, f"w1 served {served} in 300 s"
                time.sleep(1.0)
                w = observer.window()
                if started:
                    waited += float(np.nan_to_num(w.latency_s[0])) * float(w.requests[0])
                    served += float(w.requests[0])
                started = started or bool(w.requests[0] > 0)
        finally:
            observer.close()
            (bed.root / "w1" / "cpu.max").write_text(f"max {PERIOD}")
        # ... over 40 requests of its steady state (its start-up left out)
        first = wait_for(reading, 60, "a reading")

        def forty() -> Window | None:
            w = window(first, reading() or first)
            return w if w is not None and w.count >= 40 else None

        unlimited = wait_for(forty, 300, "40 requests of the service", every=2.0)
        latency = float(unlimited.stats[MEAN])
        # (on a loaded host the emulated CPU's speed drifts: with the worker's target at its
        # latency at 0.6 CPU and the service's at twice its own, they were in S 23% and 48%
        # of the time)
        targets = {"svc": 3 * latency, "w1": waited / served}
        # A band of +-25% and windows of 12 to 24 s: on the emulated CPU of a loaded host
        # (load 10 to 17) the worker's latency at a fixed cap it used to the full went 0.54
        # to 1.63 times its target from one 6 s window to the next; a decision one window
        # late would have held it within +-10% in 1 of 8 such pairs. The longer windows also
        # give a scrape 3 s (a third of one) where the throttled service took over 2.
        bed.start_daemon("--sample-interval", "0.5", "--interval", "12", "--max-interval",
                         "24", "--alpha", "0.25")
        bed.request("set-target", container=svc.name, target_s=targets["svc"], metric="mean",
                    metrics=ENDPOINT, histogram=LATENCY)
        bed.set_target(bed.workers["w1"].name, targets["w1"])

        def explain() -> str:
            return (f"--- arrivals {rate:.1f}/s, unlimited latency {1e3 * latency:.1f} ms "
                    f"({unlimited.count} requests); targets {targets} ---\n"
                    f"{format_status(bed.status())}\n--- dqoesd's log ---\n"
                    f"{bed.daemon_log.read_text()[-6000:]}")

        def containers() -> dict[str, ContainerStatus]:
            return {c.name.rsplit("/", 1)[1]: c for c in bed.status().containers}

        # In S under the daemon's limits: unlimited, at its start, either may be in its band
        # by chance (a target calibrated on an emulated CPU whose speed has moved since).
        wait_for(lambda: all(c.cls == "S" and c.cpu_limit_cores is not None
                             for c in containers().values()), 420,
                 "both in S under the daemon's limits", explain=explain, every=0.5)
        status = containers()
        assert status["svc"].metrics == ENDPOINT and status["svc"].histogram == LATENCY
        assert status["w1"].metrics is None
        # Then each decision over 150 s (every 12 to 24 s): each is in S in half of them at
        # least. (How often a worker can be depends on the emulated CPU: at a fixed cap its
        # request's CPU went 0.091 to 0.124 s from window to window on a quiet host, sd 0.11
        # in logs against the band's +-0.10, and 0.65 to 1.8 times its target with the host
        # at a load of 6 to 10; the windows are recorded with the test's properties.)
        decisions, rows = bed.status().host.decisions, []
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            now = bed.status()
            if now.host.decisions != decisions:
                decisions = now.host.decisions
                rows.append({c.name.rsplit("/", 1)[1]: c for c in now.containers})
            time.sleep(0.5)
        in_s = {n: float(np.mean([r[n].cls == "S" for r in rows])) for n in targets}
        record_property("in_s", in_s)
        record_property("targets_s", targets)
        record_property("windows", [{n: (c.cls, round(c.measured_s / targets[n], 2)
                                         if c.measured_s is not None else None,
                                         c.cpu_limit_cores, c.window_usage_cores)
                                     for n, c in r.items()} for r in rows])
        record_property("scrapes_failed", bed.daemon_log.read_text().count("scrape failed"))
        assert in_s["svc"] >= 0.5 and in_s["w1"] >= 0.5, f"in S: {in_s}\n{explain()}"
        assert bed.stop_daemon() == 0
