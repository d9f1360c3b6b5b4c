"""A CPU-bound inference worker, the workload dqoes-cg controls in its demo, tests and
experiments.

It serves requests back to back, as fast as its CPU share allows: each request runs one
batch through a small convolutional network in numpy (random weights; the cost is what
matters), and its latency goes into the container's ring through dqoes_cg.probe. Model types
of different cost stand in for the paper's VGG-16, ResNet-50, Inception...

    python -m lab.workload --model small [--ring PATH] [--duration SECONDS] [--hold]
                           [--rate PER_SECOND]

With --rate the requests arrive on their own, at random (a Poisson process of that mean
rate), and wait their turn: a request's latency runs from its arrival to its answer, its
wait in the queue included, as a service's client sees it.

With --hold the worker loads its model, runs one request unrecorded (the warm-up) and stops
itself (SIGSTOP) before serving: a testbed starts its workers ahead (a Python start and the
numpy import take seconds on an emulated CPU) and releases each with SIGCONT at its arrival
time.
"""

from __future__ import annotations

import os

# One BLAS thread: a worker is one serving thread, and its CPU use must be what its
# cgroup allows, not what a thread pool grabs. Must be set before numpy is imported.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402

from dqoes_cg.probe import Probe  # noqa: E402


@dataclass(frozen=True)
class ModelSpec:
    image: int  # input height = width
    channels: tuple[int, ...]  # output channels of each 3x3 conv layer (stride 1, pool 2 after)
    batch: int


MODELS: dict[str, ModelSpec] = {  # request cost alone on one host core (emulated guest CPU)
    "micro": ModelSpec(image=16, channels=(8, 16), batch=1),  # ~0.15 ms (guest ~15 ms)
    "tiny": ModelSpec(image=32, channels=(16, 32), batch=2),  # ~1 ms (guest ~80 ms)
    "mini": ModelSpec(image=32, channels=(16, 32), batch=6),  # ~2.3 ms (guest ~170 ms)
    "lite": ModelSpec(image=48, channels=(16, 32), batch=4),  # ~3.4 ms (guest ~245 ms)
    "small": ModelSpec(image=64, channels=(32, 64, 64), batch=4),  # ~15 ms (guest ~2-3 s)
    "medium": ModelSpec(image=96, channels=(32, 64, 96), batch=4),  # ~35 ms
    "large": ModelSpec(image=128, channels=(32, 64, 128, 128), batch=4),  # ~85 ms
}


def _im2col(x: np.ndarray) -> np.ndarray:
    """(B, C, H, W) -> (B*H*W, C*9) patches of a 3x3, stride-1, same-padded convolution."""
    b, c, h, w = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    return windows.transpose(0, 2, 3, 1, 4, 5).reshape(b * h * w, c * 9)


def build_model(name: str, seed: int = 0) -> Callable[[], np.ndarray]:
    """A closure that runs one request (one batch through the network) and returns logits."""
    spec = MODELS[name]
    rng = np.random.default_rng(seed)
    shapes = list(zip((3, *spec.channels[:-1]), spec.channels, strict=True))
    weights = [rng.standard_normal((cin * 9, cout)).astype(np.float32) / np.sqrt(cin * 9)
               for cin, cout in shapes]
    side = spec.image >> len(spec.channels)
    head = rng.standard_normal((spec.channels[-1] * side * side, 10)).astype(np.float32)
    batch = rng.standard_normal((spec.batch, 3, spec.image, spec.image)).astype(np.float32)

    def infer() -> np.ndarray:
        x = batch
        for w in weights:
            b, _, h, wd = x.shape
            y = np.maximum(_im2col(x) @ w, 0)  # conv + ReLU
            y = y.reshape(b, h, wd, -1).transpose(0, 3, 1, 2)
            x = y.reshape(b, y.shape[1], h // 2, 2, wd // 2, 2).max(axis=(3, 5))  # 2x2 max pool
        return x.reshape(x.shape[0], -1) @ head

    return infer


def serve(infer: Callable[[], np.ndarray], probe: Probe, duration: float | None) -> int:
    """Serve requests back to back for `duration` seconds (forever if None); return the count."""
    end = None if duration is None else time.monotonic() + duration
    served = 0
    while end is None or time.monotonic() < end:
        with probe.measure():
            infer()
        served += 1
    return served


def serve_arrivals(infer: Callable[[], np.ndarray], probe: Probe, rate: float,
                   duration: float | None, seed: int = 0) -> int:
    """Serve requests arriving at random at `rate` per second, first come first served, for
    `duration` seconds (forever if None); return the count."""
    rng = np.random.default_rng(seed)
    start = time.monotonic()
    end = None if duration is None else start + duration
    arrival = start + rng.exponential(1.0 / rate)
    served = 0
    while end is None or arrival < end:
        wait = arrival - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        infer()
        probe.record(time.monotonic() - arrival)
        served += 1
        arrival += rng.exponential(1.0 / rate)
    return served


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.workload", description=__doc__)
    p.add_argument("--model", choices=sorted(MODELS), default="small")
    p.add_argument("--ring", default=None, help="ring file (default: $DQOES_RING or the "
                   "probe's default path)")
    p.add_argument("--duration", type=float, default=None, help="seconds (default: forever)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate", type=float, default=None,
                   help="requests per second arriving at random (default: back to back)")
    p.add_argument("--hold", action="store_true",
                   help="warm up, then stop (SIGSTOP) until continued (SIGCONT)")
    args = p.parse_args(argv)
    infer = build_model(args.model, args.seed)
    if args.hold:
        infer()
        os.kill(os.getpid(), signal.SIGSTOP)
    with Probe.open(args.ring) as probe:
        try:
            if args.rate:
                serve_arrivals(infer, probe, args.rate, args.duration, args.seed)
            else:
                serve(infer, probe, args.duration)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
