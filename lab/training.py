"""A CPU-bound training worker, the training job dqoes-cg manages by growth efficiency
(FlowCon) in its tests and experiments.

It trains a small multilayer perceptron for real, by mini-batch gradient descent in numpy,
on a synthetic classification data set made from its seed (a random teacher network labels
random inputs), and reports its training loss through dqoes_cg.probe (`Probe.progress`)
after each epoch. Model types of different size and learning rate have loss curves that
flatten at different times, as the paper's models do.

    python -m lab.training --model fast [--ring PATH] [--epochs N] [--hold]

It exits after --epochs epochs (a job that completes), or runs until stopped. With --hold
it builds its data set and model and stops itself (SIGSTOP) before training, until
continued (SIGCONT), like lab.workload.
"""

from __future__ import annotations

import os

# One BLAS thread: the job's CPU use must be what its cgroup allows (see lab.workload).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import signal  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402

from dqoes_cg.probe import Probe  # noqa: E402

FEATURES, CLASSES = 32, 8


@dataclass(frozen=True)
class TrainingSpec:
    hidden: int  # units of the hidden layer
    learning_rate: float
    samples: int  # data set size; an epoch is one pass over it
    batch: int


MODELS: dict[str, TrainingSpec] = {  # an epoch alone on one host core: ~2, ~2.5, ~5 ms
    "fast": TrainingSpec(hidden=32, learning_rate=0.5, samples=4096, batch=64),
    "slow": TrainingSpec(hidden=64, learning_rate=0.02, samples=4096, batch=64),
    "wide": TrainingSpec(hidden=256, learning_rate=0.1, samples=4096, batch=64),
}


class Trainer:
    """A two-layer perceptron (ReLU, softmax cross-entropy) and its data set."""

    def __init__(self, spec: TrainingSpec, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.spec = spec
        self.rng = rng
        teacher = rng.standard_normal((FEATURES, CLASSES))
        self.x = rng.standard_normal((spec.samples, FEATURES)).astype(np.float32)
        self.y = np.argmax(np.tanh(self.x @ teacher) + 0.3 * rng.standard_normal(
            (spec.samples, CLASSES)), axis=1)
        scale1, scale2 = np.sqrt(2 / FEATURES), np.sqrt(2 / spec.hidden)
        self.w1 = (rng.standard_normal((FEATURES, spec.hidden)) * scale1).astype(np.float32)
        self.w2 = (rng.standard_normal((spec.hidden, CLASSES)) * scale2).astype(np.float32)

    def epoch(self) -> float:
        """One pass over the data set in shuffled mini-batches; the mean loss over it."""
        spec, total = self.spec, 0.0
        order = self.rng.permutation(spec.samples)
        for start in range(0, spec.samples, spec.batch):
            idx = order[start:start + spec.batch]
            x, y = self.x[idx], self.y[idx]
            h = np.maximum(x @ self.w1, 0)
            logits = h @ self.w2
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            rows = np.arange(len(idx))
            total += float(-np.log(p[rows, y] + 1e-12).sum())
            p[rows, y] -= 1  # d loss / d logits, times the batch size
            p /= len(idx)
            grad_h = (p @ self.w2.T) * (h > 0)
            self.w2 -= spec.learning_rate * (h.T @ p)
            self.w1 -= spec.learning_rate * (x.T @ grad_h)
        return total / spec.samples


def train(trainer: Trainer, probe: Probe, epochs: int | None) -> float:
    """Train for `epochs` epochs (forever if None), reporting each epoch's loss; the last."""
    loss, done = float("nan"), 0
    while epochs is None or done < epochs:
        loss = trainer.epoch()
        probe.progress(loss)
        done += 1
    return loss


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.training", description=__doc__)
    p.add_argument("--model", choices=sorted(MODELS), default="fast")
    p.add_argument("--ring", default=None, help="ring file (default: $DQOES_RING or the "
                   "probe's default path)")
    p.add_argument("--epochs", type=int, default=None, help="epochs (default: forever)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hold", action="store_true",
                   help="build, then stop (SIGSTOP) until continued (SIGCONT)")
    args = p.parse_args(argv)
    trainer = Trainer(MODELS[args.model], args.seed)
    if args.hold:
        os.kill(os.getpid(), signal.SIGSTOP)
    with Probe.open(args.ring) as probe:
        try:
            train(trainer, probe, args.epochs)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
