"""An HTTP inference service that knows nothing of dqoes-cg: the service a user points the
daemon at by its metrics alone (dqoes.metrics, dqoes.histogram).

It answers GET /infer on 127.0.0.1:PORT+1, one request at a time, each running one batch
through a model of lab.workload, and exports the requests' latencies as a Prometheus
histogram (prometheus_client's own, LATENCY) at http://127.0.0.1:PORT/metrics. With --rate
it drives itself, open loop: a client thread sends requests arriving at random at that
mean rate (a Poisson process), each on a connection of its own whether the ones before
were answered or not, stamped with its arrival time, so that a request's latency runs from
its arrival to its answer, its wait in the listen queue included. With --own-netns it
first moves into a network namespace of its own (only its loopback, brought up).

    python -m lab.http_service --port 8000 --model micro [--rate PER_SECOND] [--own-netns]
"""

from __future__ import annotations

import os

# One BLAS thread: one serving thread, whose CPU use is what its cgroup allows (as
# lab.workload). Set before numpy is imported.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import ctypes  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from http.server import BaseHTTPRequestHandler, HTTPServer  # noqa: E402

import numpy as np  # noqa: E402
from prometheus_client import Histogram, start_http_server  # noqa: E402

from lab.workload import MODELS, build_model  # noqa: E402

LATENCY = "request_latency_seconds"
BUCKETS = tuple(float(b) for b in np.geomspace(1e-3, 30.0, 31))  # x1.41 apart: 1 ms to 30 s
ARRIVAL_HEADER = "X-Arrival"  # the client's CLOCK_MONOTONIC at the request's arrival
CLIENTS = 64  # requests in flight at most (the listen queue holds them)
CLONE_NEWNET = 0x40000000


def own_netns() -> None:
    """Move this (single-threaded) process into a new network namespace, loopback up."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
    from pyroute2 import IPRoute

    with IPRoute() as ip:
        ip.link("set", index=ip.link_lookup(ifname="lo")[0], state="up")


def serve(port: int, model: str, seed: int) -> HTTPServer:
    """The inference server on 127.0.0.1:port (not yet serving)."""
    infer = build_model(model, seed)
    infer()  # warm-up, unrecorded
    latency = Histogram(LATENCY, "Time from a request's arrival to its answer", buckets=BUCKETS)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/infer":
                self.send_error(404)
                return
            arrival = float(self.headers.get(ARRIVAL_HEADER) or time.monotonic())
            logits = infer()
            body = f"{int(np.argmax(logits[0]))}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            latency.observe(time.monotonic() - arrival)

        def log_message(self, format: str, *args: object) -> None:
            pass

    HTTPServer.request_queue_size = 4 * CLIENTS
    return HTTPServer(("127.0.0.1", port), Handler)


def request(port: int, arrival: float) -> None:
    """One GET /infer, stamped with its arrival; errors are the service's business."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(f"GET /infer HTTP/1.0\r\n{ARRIVAL_HEADER}: {arrival!r}\r\n\r\n".encode())
            while s.recv(4096):
                pass
    except OSError:
        pass


def drive(port: int, rate: float, seed: int) -> None:
    """Requests arriving at random at `rate` per second, forever (open loop)."""
    rng = np.random.default_rng(seed)
    with ThreadPoolExecutor(CLIENTS) as clients:
        arrival = time.monotonic()
        while True:
            arrival += rng.exponential(1.0 / rate)
            wait = arrival - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            clients.submit(request, port, arrival)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=8000, help="metrics port; PORT+1 serves /infer")
    p.add_argument("--model", choices=sorted(MODELS), default="micro")
    p.add_argument("--rate", type=float, default=None, help="drive itself at this rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--own-netns", action="store_true")
    args = p.parse_args()
    if args.own_netns:
        own_netns()
    server = serve(args.port + 1, args.model, args.seed)
    start_http_server(args.port, addr="127.0.0.1")
    if args.rate:
        threading.Thread(target=drive, args=(args.port + 1, args.rate, args.seed),
                         daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
