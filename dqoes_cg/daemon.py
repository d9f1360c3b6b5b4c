"""dqoesd: the dqoes-cg daemon.

Every --sample-interval it runs one tick of the controller (sample all cgroups and rings,
decide when the policy is due, apply changed limits, reconcile), and between ticks it serves
dqoesctl on the control socket. SIGTERM/SIGINT stop it cleanly: every limit it changed is
given back. After a crash, the next start re-adopts the containers from --state-dir.
Threads help, off the loop: one tells systemd the limits of cgroups that are its units
(systemd_units), one serves Prometheus metrics when --metrics-listen asks for them, one
makes the replies to status (control.py): the loop takes only a view of its tables for one
(snapshot.py), at a cost that does not grow with the containers.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import __version__, api, startup
from .cgroup import CgroupError
from .config import Config
from .control import ControlServer, Peer
from .controller import Controller
from .engines.client import DOCKER_SOCKET, PODMAN_SOCKET
from .engines.followed import FollowedEngine
from .metrics import MetricsServer, parse_listen
from .policy import POLICIES, PolicyParams
from .sdnotify import Notifier
from .systemd_units import UnitLimiter

log = logging.getLogger("dqoesd")

SNAPSHOT_WAIT_S = 0.5
"""How long a scrape waits for the loop's lock before it is answered from the last
snapshot."""


def _parser() -> argparse.ArgumentParser:
    d, pp = Config(), PolicyParams()
    p = startup.parser("dqoesd", __doc__)
    p.add_argument("--sample-interval", type=float, default=d.sample_interval,
                   help="seconds between ticks (sample, reconcile)")
    p.add_argument("--state-dir", type=Path, default=d.state_dir,
                   help="the targets, and the limits to give back")
    p.add_argument("--run-dir", type=Path, default=d.run_dir,
                   help="runtime directory: control socket and rings/<container>/ring")
    p.add_argument("--socket", type=Path, default=None,
                   help="control socket (default RUN_DIR/dqoes.sock)")
    p.add_argument("--cgroup-mount", type=Path, default=None,
                   help="the cgroup v2 mount (default: found in /proc/self/mountinfo)")
    p.add_argument("--cpus", type=float, default=None,
                   help="CPU budget T_R of the managed containers (default: all online CPUs)")
    p.add_argument("--policy", choices=sorted(POLICIES), default=d.policy,
                   help="how limits are decided")
    p.add_argument("--alpha", type=float, default=pp.alpha, help="tolerance band")
    p.add_argument("--beta", type=float, default=pp.beta, help="step amplitude")
    p.add_argument("--interval", type=float, default=pp.iv_initial,
                   help="initial interval of the adaptive listener (IV_initial), seconds")
    p.add_argument("--max-interval", type=float, default=pp.iv_max,
                   help="ceiling of the listener's interval, seconds")
    p.add_argument("--weights", action="store_true",
                   help="set each container's cpu.weight in proportion to its limit, so that "
                        "caps adding up to the CPUs are delivered (default: cpu.weight left "
                        "alone)")
    p.add_argument("--ring-capacity", type=int, default=d.ring_capacity,
                   help="slots per ring (power of two)")
    p.add_argument("--engine-socket", type=Path, default=DOCKER_SOCKET,
                   help="the container engine's API (Docker's, or Podman's compatible one) "
                        "to follow for labelled containers and to serve the dqoes volume "
                        "driver to; '' for none")
    p.add_argument("--podman-socket", type=Path, default=PODMAN_SOCKET,
                   help="Podman's API, asked for container names")
    p.add_argument("--group", default=None,
                   help="members of this group may change targets (root always may)")
    p.add_argument("--public-status", action="store_true",
                   help="let any local user read list/status")
    p.add_argument("--metrics-listen", metavar="[ADDR:]PORT", default=None,
                   help="serve Prometheus metrics at http://ADDR:PORT/metrics (ADDR: "
                        "127.0.0.1 unless given; default: off)")
    p.add_argument("--recommend", action="store_true",
                   help="sense and decide, but write no limit: status shows the limit it "
                        "would set and the class it expects (dqoesctl act switches to acting, "
                        "dqoesctl recommend back, without a restart)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        metrics_address = parse_listen(args.metrics_listen) if args.metrics_listen else None
        params = PolicyParams(args.alpha, args.beta, args.interval, args.max_interval)
    except ValueError as e:
        parser.error(str(e))
    # Before the control socket exists: a client that sees it may signal us at once.
    stopping = startup.start(args.verbose, log)
    cfg = Config(
        sample_interval=args.sample_interval, state_dir=args.state_dir, run_dir=args.run_dir,
        mount=args.cgroup_mount, cpus=args.cpus, policy=args.policy, params=params,
        ring_capacity=args.ring_capacity, recommend=args.recommend, weights=args.weights)
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
            return api.handle(controller, op, req, peer)

    def snapshot() -> Any:
        """None while a tick holds the lock for long (a burst of containers): the metrics
        are served from the last snapshot meanwhile."""
        if not lock.acquire(timeout=SNAPSHOT_WAIT_S):
            return None
        try:
            view = controller.view()
        finally:
            lock.release()
        return view.status()  # made while the loop goes on

    metrics = None
    engine = None
    engine_socket = None if str(args.engine_socket) in ("", ".") else args.engine_socket
    try:
        engine = FollowedEngine(cfg, engine_socket, args.podman_socket) if engine_socket else None
        controller = Controller(cfg, limiter=limiter,
                                watcher=engine.watcher if engine else None,
                                runtimes=engine.runtimes if engine else ())
        server = ControlServer(args.socket or cfg.socket, handle,
                               {op: o.write for op, o in api.OPERATIONS.items()},
                               group=args.group, public_read=args.public_status)
        if metrics_address:
            metrics = MetricsServer(metrics_address, snapshot)
            log.info("metrics at http://%s:%d/metrics", *metrics.address)
    except (CgroupError, OSError, KeyError, ValueError) as e:
        log.error("cannot start: %s", e)
        if engine is not None:
            engine.close()
        limiter.close()
        return 1
    if engine is not None:
        engine.start()

    notifier.ready(controller.summary())
    log.info("dqoesd %s ready: %s, policy %s, socket %s", __version__, controller.summary(),
             controller.policy.name, server.path)
    next_tick = time.monotonic()
    try:
        while not stopping.is_set():
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
            server.poll(next_tick - time.monotonic())  # looks at least once, however late
    finally:
        notifier.stopping()
        if metrics is not None:
            metrics.close()
        server.close()
        if engine is not None:
            engine.close()
        with lock:
            controller.shutdown()
        limiter.close()  # the restored limits of systemd units go out before we exit
        log.info("dqoesd stopped; limits restored")
    return 0


if __name__ == "__main__":
    sys.exit(main())
