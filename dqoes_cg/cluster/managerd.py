"""dqoes-manager: the cluster's manager, on a Docker Swarm manager node.

It follows Swarm through its node's engine (a manager's), serves the nodes' agents on the
node's Swarm address (mutual TLS with the node's Swarm identity: identity.py, server.py),
and every --tick (or, when a tick takes longer than half of that, as long again as it
took) builds the cluster view and gives it to the placement policy if one is
chosen and to the pipelines' scaler (manager.py). `dqoesctl cluster status` reads the view
on the local control socket (--socket). Several managers may each run one: every agent
reports to all of them, and each has the whole view. SIGTERM/SIGINT stop it; it keeps
nothing on disk.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from .. import __version__, startup
from ..control import ControlServer, Later, Peer, RequestError
from ..engines.client import DOCKER_SOCKET, Engine, EngineError
from ..logs import RateLimitedLog
from ..paths import MANAGER_SOCKET, STATE_DIR
from ..sdnotify import Notifier
from .darly import SCHEDULERS
from .darly_scaling import DarlyParams, DarlyScaling
from .identity import Credentials, IdentityError
from .manager import NODE_TIMEOUT_S, PLACEMENTS, Manager
from .placement import PlacementParams
from .protocol import CLUSTER_PORT
from .scaler import ScalerParams
from .scaling import ModelScaling
from .server import Server
from .view_json import ViewJSON

log = logging.getLogger("dqoes-manager")

TICK_S = 1.0
OPERATIONS = {"cluster-status": False, "cluster-act": True,
              "cluster-recommend": True}  # name: whether it writes


def swarm_of(engine: Engine) -> tuple[str, str, str, Path]:
    """(node ID, Swarm ID, the node's Swarm address, dockerd's data root) of a manager's
    engine; ValueError if it is no Swarm manager."""
    info = engine.get("/info")
    swarm = info.get("Swarm") if isinstance(info, dict) else None
    if not isinstance(swarm, dict) or swarm.get("LocalNodeState") != "active":
        raise ValueError(f"{engine} is in no Swarm")
    if swarm.get("ControlAvailable") is not True:
        raise ValueError(f"{engine} is no Swarm manager: run dqoes-manager on a manager node")
    try:
        return (str(swarm["NodeID"]), str(swarm["Cluster"]["ID"]), str(swarm["NodeAddr"]),
                Path(info["DockerRootDir"]))
    except (KeyError, TypeError) as e:
        raise ValueError(f"{engine} gives no {e} in its Swarm information") from None


def swarm_when_it_answers(engine: Engine, stopping: threading.Event,
                          first_wait_s: float = 1.0) -> tuple[str, str, str, Path] | None:
    """swarm_of(engine) once the engine answers: at boot, or on a loaded host, dockerd may
    not answer yet, and the manager waits for it (retrying at most every 30 s) rather than
    exit. None if `stopping` is set first; ValueError (no Swarm manager) at once."""
    wait = first_wait_s
    while True:
        try:
            return swarm_of(engine)
        except EngineError as e:
            if wait == first_wait_s:
                log.warning("%s; waiting for it", e)
        if stopping.wait(wait):
            return None
        wait = min(2 * wait, 30.0)


def handler(manager: Manager) -> Callable[[str, dict[str, Any], Peer], Any]:
    """The control socket's requests (OPERATIONS): the last view, as JSON (made away from
    the socket's loop, once per view: view_json.py); or a switch to making placement's
    updates (cluster-act) or only recommending them (cluster-recommend)."""
    statuses = ViewJSON()

    def handle(op: str, req: dict[str, Any], peer: Peer) -> Any:
        if op in ("cluster-act", "cluster-recommend"):
            acting = op == "cluster-act"
            if manager.set_acting(acting):
                log.info("switched to %s by uid %d", "acting" if acting else "recommending",
                         peer.uid)
            return {"acting": acting}
        view = manager.view()
        if view is None:
            raise RequestError("the manager has no view yet")
        return Later(partial(statuses.of, view))

    return handle


def parse_listen(text: str, default_host: str) -> tuple[str, int]:
    """'2378' -> (default_host, 2378); 'ADDR:PORT'; '[ADDR6]:PORT'."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]") if sep else default_host
    if not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise ValueError(f"bad address {text!r}: use PORT, ADDR:PORT or [ADDR6]:PORT")
    return host, int(port)


def _parser() -> argparse.ArgumentParser:
    p = startup.parser("dqoes-manager", __doc__)
    p.add_argument("--engine-socket", type=Path, default=DOCKER_SOCKET,
                   help="the manager node's Docker engine (default %(default)s)")
    p.add_argument("--listen", default=str(CLUSTER_PORT), metavar="[ADDR:]PORT",
                   help="where the agents connect (default: the node's Swarm address, port "
                        "%(default)s)")
    p.add_argument("--certs", type=Path, default=None,
                   help="the node's Swarm certificates (default: DATA_ROOT/swarm/"
                        "certificates of its engine)")
    p.add_argument("--socket", type=Path, default=MANAGER_SOCKET,
                   help="control socket for dqoesctl cluster (default %(default)s)")
    p.add_argument("--group", default=None, help="members of this group may read the view")
    p.add_argument("--public-status", action="store_true",
                   help="let any local user read the view")
    p.add_argument("--tick", type=float, default=TICK_S,
                   help="seconds between reads of Swarm and views (default %(default)s)")
    p.add_argument("--node-timeout", type=float, default=NODE_TIMEOUT_S,
                   help="seconds without a report before a node is unreachable "
                        "(default %(default)s)")
    p.add_argument("--placement", choices=sorted(PLACEMENTS), default=None,
                   help="the placement policy (default: none, Swarm places alone)")
    defaults = PlacementParams()
    p.add_argument("--settle", type=float, default=defaults.settle_s, metavar="S",
                   help="placement: seconds a task stays stuck out of S before it moves, and "
                        "a paused node roomy before it reopens (default %(default)s)")
    p.add_argument("--hold", type=float, default=defaults.hold_s, metavar="S",
                   help="placement: seconds a moved service stays put (default %(default)s)")
    p.add_argument("--max-moves-per-minute", type=int, default=defaults.max_moves_per_minute,
                   metavar="N", help="placement: moves over the cluster (default %(default)s)")
    scaler = ScalerParams()
    p.add_argument("--scaler", choices=("model", "none"), default="model",
                   help="how pipelines' stages are scaled out and in (default %(default)s: "
                        "from the model of their work, rate and share; none: never)")
    p.add_argument("--max-scales-per-minute", type=int, metavar="N",
                   default=scaler.max_actions_per_minute,
                   help="scaler: actions per pipeline (default %(default)s)")
    p.add_argument("--scheduler", choices=SCHEDULERS, default=None,
                   help="scale and move pipelines' stages with Darly's learned agent instead "
                        "of --scaler, its moves' destinations chosen as the scheduler says "
                        "(README: Darly); same limits as the scaler")
    p.add_argument("--weights", type=Path, default=STATE_DIR / "darly", metavar="DIR",
                   help="--scheduler: the agent's weights, loaded at the start and saved "
                        "as it learns (default %(default)s)")
    p.add_argument("--recommend", action="store_true",
                   help="placement and scaler decide, but make no update: dqoesctl cluster "
                        "status "
                        "shows what it would do (dqoesctl cluster act switches to acting, "
                        "dqoesctl cluster recommend back, without a restart)")
    return p


def _scaling(args: argparse.Namespace, scaler: ScalerParams
             ) -> ModelScaling | DarlyScaling | None:
    if args.scheduler is not None:
        return DarlyScaling(DarlyParams(
            scheduler=args.scheduler, weights_dir=args.weights,
            max_actions_per_minute=scaler.max_actions_per_minute))
    return ModelScaling(scaler) if args.scaler == "model" else None


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, its placement's and scaler's parameters checked (exits on a bad
    one, as argparse does)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        args.placement_params = PlacementParams(
            settle_s=args.settle, hold_s=args.hold,
            max_moves_per_minute=args.max_moves_per_minute)
        args.scaler_params = ScalerParams(max_actions_per_minute=args.max_scales_per_minute)
    except ValueError as e:
        parser.error(str(e))
    return args


def manager_of(args: argparse.Namespace, engine: Engine, node_id: str) -> Manager:
    """The manager the command line (`parse`) asks for, following Swarm through `engine`,
    a manager node's."""
    return Manager(engine, node_id, args.node_timeout,
                   PLACEMENTS[args.placement](args.placement_params) if args.placement
                   else None,
                   acting=not args.recommend, scaling=_scaling(args, args.scaler_params))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    stopping = startup.start(args.verbose, log)
    engine = Engine(args.engine_socket)
    try:
        swarm = swarm_when_it_answers(engine, stopping)
        if swarm is None:
            return 0
        node_id, swarm_id, address, data_root = swarm
        listen = parse_listen(args.listen, address)
        credentials = Credentials(args.certs) if args.certs else \
            Credentials.of_data_root(data_root)
        manager = manager_of(args, engine, node_id)
        manager.tick(time.monotonic())
        server = Server(manager, credentials, swarm_id, listen)
    except (EngineError, ValueError, IdentityError, OSError) as e:
        log.error("cannot start: %s", e)
        return 1

    try:
        control = ControlServer(args.socket, handler(manager), OPERATIONS, group=args.group,
                                public_read=args.public_status)
    except (OSError, KeyError) as e:
        log.error("cannot start: %s", e)
        server.close()
        return 1
    server.start()
    notifier = Notifier()
    notifier.ready(f"node {node_id}, listening on {listen[0]}:{listen[1]}")
    log.info("dqoes-manager %s ready: node %s of Swarm %s, agents on %s:%d, socket %s%s",
             __version__, node_id, swarm_id, *server.address, args.socket,
             "; recommending only: placement makes no update" if args.recommend else "")
    try:
        serve(manager, control, notifier, args.tick, stopping)
    finally:
        notifier.stopping()
        control.close()
        server.close()
        log.info("dqoes-manager stopped")
    return 0


def serve(manager: Manager, control: ControlServer, notifier: Notifier, tick_s: float,
          stopping: threading.Event) -> None:
    """Answers the control socket until `stopping`, while a thread of its own reads Swarm
    and builds the view every `tick_s`: Swarm's API may take its timeout to answer (10 s),
    and `dqoesctl cluster status` is answered from the last view meanwhile."""
    ticker = threading.Thread(target=_tick, args=(manager, tick_s, stopping),
                              name="dqoes-swarm", daemon=True)
    ticker.start()
    try:
        while not stopping.is_set():
            view = manager.view()
            if view is not None:
                notifier.alive(f"{len(view.nodes)} nodes, {len(view.tasks)} tasks, "
                               f"|S| {view.satisfied()}")
            control.poll(tick_s)
    finally:
        stopping.set()
        ticker.join()


def _tick(manager: Manager, tick_s: float, stopping: threading.Event) -> None:
    failures = RateLimitedLog(log)
    next_tick = time.monotonic() + tick_s
    while not stopping.wait(max(0.0, next_tick - time.monotonic())):
        now = time.monotonic()
        try:
            manager.tick(now, now - next_tick)
        except Exception:  # a bug must not leave the view stale for good
            failures.log(logging.ERROR, "tick", "the cluster's tick failed", exc_info=True)
        # A tick that took long waits as long again: the ticks keep at most half of the
        # process's one core (the GIL), the rest is the reports' (pace.py)
        next_tick = max(next_tick + tick_s, 2 * time.monotonic() - now)


if __name__ == "__main__":
    sys.exit(main())
