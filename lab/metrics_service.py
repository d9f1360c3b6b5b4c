"""An inference service that knows nothing of dqoes-cg: the service a user points the
daemon at by its metrics alone (dqoes.metrics, dqoes.histogram).

Its requests arrive on their own, at random (lab.workload's --rate: a Poisson process),
and wait their turn; each runs one batch through a model of lab.workload, and its latency,
from its arrival to its answer, goes into a Prometheus histogram (prometheus_client's own,
LATENCY), which prometheus_client's HTTP server exports at http://127.0.0.1:PORT/metrics.
With --own-netns it first moves into a network namespace of its own (only its loopback,
brought up), as a container's.

    python -m lab.metrics_service --port 8000 --model micro --rate PER_SECOND [--own-netns]
"""

from __future__ import annotations

import os

# One BLAS thread: one serving thread, whose CPU use is what its cgroup allows (as
# lab.workload). Set before numpy is imported.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import ctypes  # noqa: E402

import numpy as np  # noqa: E402
from prometheus_client import Histogram, start_http_server  # noqa: E402

from lab.workload import MODELS, build_model, serve_arrivals  # noqa: E402

LATENCY = "request_latency_seconds"
BUCKETS = tuple(float(b) for b in np.geomspace(1e-3, 30.0, 31))  # x1.41 apart: 1 ms to 30 s
CLONE_NEWNET = 0x40000000


class HistogramProbe:
    """What lab.workload's serving loop records into: here, the service's histogram."""

    def __init__(self) -> None:
        self.latency = Histogram(LATENCY, "Time from a request's arrival to its answer",
                                 buckets=BUCKETS)

    def record(self, latency_s: float) -> None:
        self.latency.observe(latency_s)


def own_netns() -> None:
    """Move this (single-threaded) process into a new network namespace, loopback up."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
    from pyroute2 import IPRoute

    with IPRoute() as ip:
        ip.link("set", index=ip.link_lookup(ifname="lo")[0], state="up")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", choices=sorted(MODELS), default="micro")
    p.add_argument("--rate", type=float, required=True, help="requests per second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--own-netns", action="store_true")
    args = p.parse_args()
    if args.own_netns:
        own_netns()
    infer = build_model(args.model, args.seed)
    infer()  # warm-up, unrecorded
    probe = HistogramProbe()
    start_http_server(args.port, addr="127.0.0.1")
    serve_arrivals(infer, probe, args.rate, None, args.seed)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
