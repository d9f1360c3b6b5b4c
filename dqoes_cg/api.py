"""The request API of the daemon: what each operation of the control protocol does, and
which need write permission. Domain errors become one-line protocol errors here.

    set-target    container, target_s, metric (default p95), pending (default false);
                  training (default false): a training job, with neither target_s nor
                  metric; metrics (":PORT/PATH") and histogram: its latencies from that
                  Prometheus histogram instead of its ring
    unset-target  container
    list          limit, cursor (optional): a page of it (paging.py)
    status        container, or limit and cursor (optional): a page of it (paging.py)
    act           write the limits decided (from the next decision)
    recommend     write none, and give back those written: status shows what it would set
    service-labels  service_id, labels (an object of strings, or null to forget them): a
                  Swarm service's labels, for its tasks on this node (from a cluster
                  component, where this node's engine cannot list services)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from .control import Later, Peer, RequestError
from .controller import Controller
from .membership.objective import DEFAULT_METRIC, TRAINING_JOB, Objective, scrape_from
from .membership.targets import TargetError
from .paging import Page, PageError, page_of
from .snapshot import Listings, View
from .state import StateError

log = logging.getLogger(__name__)

MAX_NAME = 256


@dataclass(frozen=True)
class Operation:
    write: bool  # needs root or the daemon's control group
    run: Callable[[Controller, dict[str, Any], Peer], Any]  # in the loop
    # None: what `run` returns is the reply; else the reply made of it away from the loop
    # (the work that grows with the number of targets)
    reply: Callable[[Any], Any] | None = None


def _set_target(c: Controller, req: dict[str, Any], peer: Peer) -> Any:
    name = _name(req.get("container"))
    pending, training = req.get("pending", False), req.get("training", False)
    if not isinstance(pending, bool):
        raise RequestError("pending must be true or false")
    if not isinstance(training, bool):
        raise RequestError("training must be true or false")
    try:
        scrape = scrape_from(req.get("metrics"), req.get("histogram"))
    except ValueError as e:
        raise RequestError(str(e)) from None
    if training:
        objective = TRAINING_JOB
        if req.get("target_s") is not None or req.get("metric") is not None or scrape:
            raise RequestError("a training job has no target_s, metric or histogram")
    else:
        objective = Objective(req.get("target_s"), req.get("metric", DEFAULT_METRIC),
                              scrape=scrape)
    listed = c.set_target(name, objective, pending)
    log.info("%s: %s, set by uid %d", name, objective, peer.uid)
    return listed.to_json()


def _unset_target(c: Controller, req: dict[str, Any], peer: Peer) -> Any:
    name = _name(req.get("container"))
    restored = c.unset_target(name)
    log.info("%s: target removed by uid %d%s", name, peer.uid,
             f"; cpu.max restored to '{restored}'" if restored else "")
    return {"name": name, "restored": restored}


def _list(c: Controller, req: dict[str, Any], peer: Peer) -> tuple[Listings, Page | None]:
    return c.listings_later(), _page(req)


def _list_reply(taken: tuple[Listings, Page | None]) -> Any:
    listings, page = taken
    return [t.to_json() for t in listings()] if page is None else listings.page(page)


def _status(c: Controller, req: dict[str, Any], peer: Peer) -> tuple[View, Page | None]:
    only, page = req.get("container"), _page(req)
    if only is not None and page is not None:
        raise RequestError("a status of one container has no pages: ask for it without "
                           "limit or cursor")
    return c.view(None if only is None else _name(only)), page


def _status_reply(taken: tuple[View, Page | None]) -> Any:
    view, page = taken
    return view.status_json() if page is None else view.page(page)


def _page(req: dict[str, Any]) -> Page | None:
    try:
        return page_of(req)
    except PageError as e:
        raise RequestError(str(e)) from None


def _service_labels(c: Controller, req: dict[str, Any], peer: Peer) -> Any:
    sid, labels = req.get("service_id"), req.get("labels")
    if not isinstance(sid, str) or not 0 < len(sid) <= MAX_NAME or not sid.isalnum():
        raise RequestError("service_id must be a service's ID")
    if labels is not None and not (isinstance(labels, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items())):
        raise RequestError("labels must be an object of strings, or null")
    c.push_service_labels(sid, labels)
    log.info("service %s: labels %s by uid %d", sid[:12],
             "forgotten" if labels is None else "set", peer.uid)
    return {"service_id": sid}


def _act(c: Controller, req: dict[str, Any], peer: Peer) -> Any:
    return _mode(c, True, peer)


def _recommend(c: Controller, req: dict[str, Any], peer: Peer) -> Any:
    return _mode(c, False, peer)


def _mode(c: Controller, acting: bool, peer: Peer) -> Any:
    if c.set_acting(acting):
        log.info("switched to %s by uid %d", "acting" if acting else "recommending", peer.uid)
    return {"acting": acting}


OPERATIONS: dict[str, Operation] = {
    "set-target": Operation(True, _set_target),
    "unset-target": Operation(True, _unset_target),
    "list": Operation(False, _list, _list_reply),
    "status": Operation(False, _status, _status_reply),
    "service-labels": Operation(True, _service_labels),
    "act": Operation(True, _act),
    "recommend": Operation(True, _recommend),
}
WRITE_OPS = frozenset(op for op, o in OPERATIONS.items() if o.write)


def handle(controller: Controller, op: str, req: dict[str, Any], peer: Peer) -> Any:
    """Run a request the control server has parsed and authorized: its reply, or what
    makes it away from the loop (`Later`)."""
    operation = OPERATIONS[op]
    try:
        taken = operation.run(controller, req, peer)
    except (TargetError, StateError) as e:
        raise RequestError(str(e)) from None
    return taken if operation.reply is None else Later(partial(operation.reply, taken))


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RequestError("container must be a non-empty name")
    if len(value) > MAX_NAME or not value.isprintable():
        raise RequestError(f"container name must be printable and at most {MAX_NAME} "
                           "characters")
    return value
