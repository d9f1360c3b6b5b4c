"""What scraping one service's latency histogram costs dqoesd, per container and window.

    python3 -m bench.scrape [--repeat 100] [--label-sets 10]

A local HTTP server (python3 -m http.server, a process of its own) answers with
prometheus_client's own exposition of a histogram of `--label-sets` label sets (its
default 15 buckets each, a few other metrics beside); one
scrape is what dqoesd does for a container each window: fetch (a fresh connection, the
whole answer read), parse with prometheus_client's parser, add the label sets up, and the
window's statistics from the reading before. Reported: the median and the 90th percentile
of `--repeat` scrapes, wall and CPU time of the scraping thread; with root, also through
the network-namespace entry (the thread that makes the socket there, here this process's
own namespace).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from dqoes_cg.histogram import Reading, window
from dqoes_cg.membership.objective import Scrape
from dqoes_cg.scrape import Job, ScrapeError, parse, scrape
from lab.shell import wait_for


def exposition(label_sets: int) -> bytes:
    """A service's metrics: a latency histogram of `label_sets` label sets and a few
    other metrics, as prometheus_client renders them."""
    registry = CollectorRegistry()
    h = Histogram("request_latency_seconds", "Request latency", ["model", "version"],
                  registry=registry)
    Counter("requests", "Requests", ["code"], registry=registry).labels("200").inc(1e6)
    Gauge("queue_length", "Requests waiting", registry=registry).set(3)
    rng = np.random.default_rng(0)
    for i in range(label_sets):
        child = h.labels(model=f"model-{i}", version="1")
        for value in rng.lognormal(-3, 1, 1000):
            child.observe(value)
    return generate_latest(registry)


def serve(body: bytes, directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A static server of `body` at /metrics, in a process of its own: (it, its port)."""
    (directory / "metrics").write_bytes(body)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "http.server", "-b", "127.0.0.1", "-d",
                               str(directory), str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    return server, port


def measure(once: Callable[[], object], repeat: int) -> dict[str, float]:
    wall, cpu = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.thread_time()
        once()
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - w)
    return {"wall_median_ms": 1e3 * float(np.median(wall)),
            "wall_p90_ms": 1e3 * float(np.percentile(wall, 90)),
            "cpu_median_ms": 1e3 * float(np.median(cpu))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=100)
    p.add_argument("--label-sets", type=int, default=10)
    args = p.parse_args()
    body = exposition(args.label_sets)
    workdir = Path(tempfile.mkdtemp(prefix="dqoes-bench-scrape-"))
    server, port = serve(body, workdir)
    job = Job("svc", "/none", Scrape(f":{port}/metrics", "request_latency_seconds"), "p95")
    print(f"exposition: {len(body):,} bytes, {args.label_sets} label sets; "
          f"{args.repeat} scrapes each")
    before = wait_for(lambda: _try(job), 30, "the server", every=0.1)

    def once(mount: Path | None = None, j: Job = job) -> None:
        window(before, scrape(j, mount, timeout=10.0))

    text = body.decode()
    ways: dict[str, Callable[[], None]] = {
        "parse and window only": lambda: window(before, parse(text, job.scrape.histogram)),
        "host network namespace": once}
    if os.geteuid() == 0:  # a stand-in cgroup mount whose cgroup lists this process
        line = next(x for x in Path("/proc/self/cgroup").read_text().splitlines()
                    if x.startswith("0::/"))
        mount = workdir / "mount"
        cgroup = mount / line[4:].lstrip("/")
        cgroup.mkdir(parents=True, exist_ok=True)
        (cgroup / "cgroup.procs").write_text(f"{os.getpid()}\n")
        in_netns = Job(job.name, str(cgroup), job.scrape, job.metric)
        ways["entering the netns (setns thread)"] = lambda: once(mount, in_netns)
    for what, how in ways.items():
        r = measure(how, args.repeat)
        print(f"{what:36} wall median {r['wall_median_ms']:.2f} ms (p90 "
              f"{r['wall_p90_ms']:.2f} ms), CPU median {r['cpu_median_ms']:.2f} ms")
    server.kill()
    server.wait()


def _try(job: Job) -> Reading | None:
    try:
        return scrape(job, None)
    except ScrapeError:
        return None


if __name__ == "__main__":
    main()
