"""dqoesd: the dqoes-cg daemon.

Every --sample-interval it runs one tick of the controller (sample all cgroups and rings,
decide when the policy is due, apply changed limits, reconcile), and between ticks it serves
dqoesctl on the control socket. SIGTERM/SIGINT stop it cleanly: every limit it changed is
given back. After a crash, the next start re-adopts the containers from --state-dir.
Two threads help, off the loop: one tells systemd the limits of cgroups that are its units
(systemd_units), one serves Prometheus metrics when --metrics-listen asks for them.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .cgroup import CgroupError
from .control import ControlServer, Peer
from .controller import Config, Controller
from .metrics import MetricsServer, parse_listen
from .policy import POLICIES
from .sdnotify import Notifier
from .systemd_units import UnitLimiter

log = logging.getLogger("dqoesd")

_SYSLOG_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
                    logging.CRITICAL: 2}


class _JournalFormatter(logging.Formatter):
    """'<N>message': journald reads the priority from the prefix and adds its own timestamp."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{_SYSLOG_PRIORITY.get(record.levelno, 6)}>{super().format(record)}"


def _setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):
        handler.setFormatter(_JournalFormatter("%(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])


def _parser() -> argparse.ArgumentParser:
    d = Config()
    p = argparse.ArgumentParser(prog="dqoesd", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sample-interval", type=float, default=d.sample_interval,
                   help="seconds between ticks (sample, reconcile)")
    p.add_argument("--state-dir", type=Path, default=d.state_dir)
    p.add_argument("--run-dir", type=Path, default=d.run_dir,
                   help="runtime directory: control socket and rings/<container>/ring")
    p.add_argument("--socket", type=Path, default=None,
                   help="control socket (default RUN_DIR/dqoes.sock)")
    p.add_argument("--cgroup-mount", type=Path, default=None,
                   help="the cgroup v2 mount (default: found in /proc/self/mountinfo)")
    p.add_argument("--cpus", type=float, default=None,
                   help="CPU budget T_R of the managed containers (default: all online CPUs)")
    p.add_argument("--policy", choices=sorted(POLICIES), default=d.policy,
                   help="the policy that sets the limits")
    p.add_argument("--alpha", type=float, default=d.alpha, help="tolerance band")
    p.add_argument("--beta", type=float, default=d.beta, help="step amplitude")
    p.add_argument("--interval", type=float, default=d.iv_initial,
                   help="initial interval of the adaptive listener (IV_initial), seconds")
    p.add_argument("--max-interval", type=float, default=d.iv_max,
                   help="ceiling of the listener's interval, seconds")
    p.add_argument("--ring-capacity", type=int, default=d.ring_capacity,
                   help="slots per ring (power of two)")
    p.add_argument("--docker-root", type=Path, default=d.docker_root)
    p.add_argument("--group", default=None,
                   help="members of this group may change targets (root always may)")
    p.add_argument("--public-status", action="store_true",
                   help="let any local user read list/status")
    p.add_argument("--metrics-listen", metavar="[ADDR:]PORT", default=None,
                   help="serve Prometheus metrics at http://ADDR:PORT/metrics (ADDR: "
                        "127.0.0.1 unless given; default: off)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        metrics_address = parse_listen(args.metrics_listen) if args.metrics_listen else None
    except ValueError as e:
        parser.error(str(e))
    _setup_logging(args.verbose)
    faulthandler.enable()  # a hung loop killed by the watchdog (SIGABRT) logs where it hung
    cfg = Config(
        sample_interval=args.sample_interval, state_dir=args.state_dir, run_dir=args.run_dir,
        mount=args.cgroup_mount, cpus=args.cpus, policy=args.policy, alpha=args.alpha,
        beta=args.beta, iv_initial=args.interval, iv_max=args.max_interval,
        ring_capacity=args.ring_capacity, docker_root=args.docker_root)
    notifier = Notifier()
    watchdog = notifier.watchdog_interval()
    if watchdog is not None and watchdog < cfg.sample_interval:
        log.warning("the watchdog expects a ping every %.1f s, the loop ticks every %.1f s",
                    watchdog, cfg.sample_interval)
    limiter = UnitLimiter()
    # Held while the loop ticks or answers a request, and while metrics take a snapshot:
    # the metrics thread never reads the per-container arrays half-updated.
    lock = threading.Lock()

    def handle(op: str, req: dict[str, Any], peer: Peer) -> Any:
        with lock:
            return controller.handle(op, req, peer)

    def snapshot() -> dict[str, Any]:
        with lock:
            status = controller.status()
        return {**status, "systemd": {"sent": limiter.sent, "failed": limiter.failed}}

    metrics = None
    try:
        controller = Controller(cfg, limiter=limiter)
        server = ControlServer(args.socket or cfg.run_dir / "dqoes.sock", handle,
                               group=args.group, public_read=args.public_status)
        if metrics_address:
            metrics = MetricsServer(metrics_address, snapshot)
            log.info("metrics at http://%s:%d/metrics", *metrics.address)
    except (CgroupError, OSError, KeyError) as e:
        log.error("cannot start: %s", e)
        limiter.close()
        return 1

    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        log.info("%s: stopping", signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    notifier.ready(controller.summary())
    log.info("dqoesd ready: %s, socket %s", controller.summary(), server.path)
    next_tick = time.monotonic()
    try:
        while not stopping:
            now = time.monotonic()
            if now >= next_tick:
                with lock:
                    controller.tick(now)
                if notifier.enabled:
                    notifier.alive(controller.summary())
                # Keep the cadence; after a stall, skip the missed ticks rather than bunch up.
                next_tick += cfg.sample_interval
                if next_tick < now:
                    next_tick = now + cfg.sample_interval
            server.poll(next_tick - time.monotonic())
    finally:
        notifier.stopping()
        if metrics is not None:
            metrics.close()
        server.close()
        with lock:
            controller.shutdown()
        limiter.close()  # the restored limits of systemd units go out before we exit
        log.info("dqoesd stopped; limits restored")
    return 0


if __name__ == "__main__":
    sys.exit(main())
