"""dqoesctl: set QoE targets and watch the controller.

    dqoesctl set-target CONTAINER TARGET [--metric mean|p50|p90|p95|p99] [--pending]
                        [--metrics :PORT/PATH --histogram NAME]
    dqoesctl set-target CONTAINER --training [--pending]
    dqoesctl unset-target CONTAINER
    dqoesctl list [--json]
    dqoesctl status [CONTAINER] [--json | --interference] [--watch [SECONDS]]
    dqoesctl cluster status [--json] [--watch [SECONDS]]   (on a Swarm manager)
    dqoesctl cluster act | recommend     (make placement's updates, or only show them)
    dqoesctl act | recommend     (write the limits decided, or only show them)

CONTAINER is a Docker/Podman name or ID (prefix), a cgroup path, a PID or a systemd unit.
TARGET is a duration with a unit: 250us, 40ms, 1.5s. --training makes the container a
training job instead: no target, its CPU shared with the other training jobs by the
progress it reports (FlowCon). --metrics and --histogram take the latencies from a
Prometheus histogram the service exports (at 127.0.0.1:PORT/PATH in its network namespace)
instead of its ring. Every error is one line on stderr and a non-zero exit
status, and changes nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from . import __version__
from .cluster.show import format_cluster
from .cluster.view import ClusterView
from .control import DaemonUnavailable, RequestError, request
from .duration import format_duration, parse_duration
from .membership.objective import DEFAULT_METRIC, METRICS, TRAINING
from .paging import MAX_LIMIT
from .paths import DEFAULT_SOCKET, MANAGER_SOCKET
from .status import PRESSURE_RESOURCES, ContainerStatus, Listing, Status
from .table import format_table

EXIT_ERROR = 1
EXIT_UNAVAILABLE = 3
def _cores(value: float | None) -> str:
    return "max" if value is None else f"{value:.2f}"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _source(c: ContainerStatus) -> str:
    """Where a service's latencies come from: its ring, or the histogram it exports
    (with the error bound of the measured statistic, the width of its bucket)."""
    if c.metrics is None:
        return "ring"
    bound = "" if c.measured_error_s is None else f" ±{format_duration(c.measured_error_s)}"
    return f"{c.metrics} {c.histogram}{bound}"


def format_status(status: Status) -> str:
    services = [c for c in status.containers if c.kind != TRAINING]
    jobs = [c for c in status.containers if c.kind == TRAINING]
    tables = []
    if services or not jobs:
        recommending = not status.host.acting
        rows = [("CONTAINER", "CLASS", "TARGET", "METRIC", "MEASURED", "Q", "LIMIT", "USAGE",
                 "THROTTLED", "SAMPLES", "SOURCE") + (("WOULD SET", "EXPECTED") if recommending
                                                      else ())]
        for c in services:
            q = c.q_s
            rows.append((
                c.name, c.cls + ("!" if c.contested else ""), format_duration(c.target_s),
                c.metric or "-", format_duration(c.measured_s),
                "-" if q is None else ("+" if q >= 0 else "") + format_duration(q),
                _cores(c.cpu_limit_cores), f"{c.cpu_usage_cores:.2f}",
                f"{c.throttled_ratio * 100:.0f}%", str(c.samples), _source(c),
            ) + (("-" if c.recommended_limit_cores is None else
                  f"{c.recommended_limit_cores:.2f}", c.expected_class or "-")
                 if recommending else ()))
        tables.append(format_table(rows))
    if jobs:
        rows = [("TRAINING JOB", "LIST", "EVALUATION", "GROWTH", "LIMIT", "USAGE",
                 "THROTTLED")]
        rows += [(c.name, c.cls + ("!" if c.contested else ""), _number(c.evaluation),
                  _number(c.growth_efficiency), _cores(c.cpu_limit_cores),
                  f"{c.cpu_usage_cores:.2f}", f"{c.throttled_ratio * 100:.0f}%")
                 for c in jobs]
        tables.append(format_table(rows))
    h = status.host
    age = h.last_decision_age_s
    lists = f"  | NL {h.NL}  WL {h.WL}  CL {h.CL}" if jobs else ""
    lines = ["\n\n".join(tables), "",
             f"G {h.G}  S {h.S}  B {h.B}  idle {h.idle}  pending {h.pending}{lists}"
             f"  | policy {h.policy}, interval {h.interval_s:.0f}s, last decision "
             + ("never" if age is None else f"{age:.0f}s ago")
             + f", budget {h.budget_cpus:g} CPUs"]
    if not h.acting:
        lines.append("recommend only: no limit is written (WOULD SET: what it would set, in "
                     "CPUs; dqoesctl act to act)")
    lines += [f"{c.name}: scrape of {c.metrics} failed: {c.scrape_error}"
              for c in services if c.scrape_error]
    if h.contested:
        lines.append(f"! {h.contested} contested: another writer keeps changing their "
                     "cpu.max or cpu.weight, which is left to it for a while (see the "
                     "daemon's log)")
    return "\n".join(lines)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _stall(pressure: dict[str, dict[str, float | None]], resource: str, key: str) -> str:
    value = pressure.get(resource, {}).get(key)
    if value is None:
        return "-"
    return f"{value:.1f}%" if key == "avg10_pct" else _share(value)


def format_interference(status: Status) -> str:
    """What slows the node and each container: the share of the last window in which some
    task stalled on each resource (cpu, memory, io), the kernel's avg10 on the node, the
    share of periods throttled, and hardware counters where the host has them."""
    h = status.host
    node = "  ".join(f"{r} {_stall(h.pressure, r, 'some_ratio')} "
                     f"(avg10 {_stall(h.pressure, r, 'avg10_pct')})"
                     for r in PRESSURE_RESOURCES)
    counted = any(c.ipc is not None for c in status.containers)
    rows = [("CONTAINER", "CPU SOME", "MEMORY SOME", "IO SOME", "THROTTLED")
            + (("IPC", "LLC MISS/S") if counted else ())]
    rows += [(c.name,
              *(_stall(c.pressure, r, "some_ratio") for r in PRESSURE_RESOURCES),
              _share(c.throttled_window_ratio))
             + ((_number(c.ipc), _number(c.llc_misses_per_s)) if counted else ())
             for c in status.containers]
    lines = [f"node pressure (some, last window): {node}"]
    if h.ipc is not None:
        lines.append(f"node IPC {_number(h.ipc)}, LLC misses {_number(h.llc_misses_per_s)}/s")
    lines += ["", format_table(rows)]
    if h.hardware_counters:
        lines += ["", h.hardware_counters]
    return "\n".join(lines)


def format_list(targets: list[Listing]) -> str:
    rows = [("CONTAINER", "KIND", "TARGET", "METRIC", "STATE", "SOURCE", "CGROUP")]
    rows += [(t.name, t.kind or "-", format_duration(t.target_s), t.metric or "-", t.state,
              t.source, (t.cgroup or "-") + (f" ({t.reason})" if t.reason else ""))
             for t in targets]
    return format_table(rows)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, like every other error of dqoesctl (argparse would add the usage)."""
        self.exit(2, f"dqoesctl: {message} (see dqoesctl --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dqoesctl", description="Control the dqoes-cg daemon.")
    p.add_argument("--version", action="version", version=f"dqoesctl {__version__}")
    p.add_argument("--socket", type=Path,
                   default=Path(os.environ.get("DQOES_SOCKET", DEFAULT_SOCKET)),
                   help="daemon control socket (default %(default)s, or $DQOES_SOCKET)")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("set-target",
                       help="give a container a QoE target, or make it a training job")
    s.add_argument("container")
    s.add_argument("target", nargs="?", help="e.g. 250us, 40ms, 1.5s (not with --training)")
    s.add_argument("--metric", choices=METRICS,
                   help=f"latency statistic compared with the target (default {DEFAULT_METRIC})")
    s.add_argument("--pending", action="store_true",
                   help="accept a container that does not exist yet; bind it when it appears")
    s.add_argument("--metrics", metavar=":PORT/PATH",
                   help="take the latencies from the service's Prometheus metrics there, "
                        "inside its network namespace (e.g. :8000/metrics), not its ring")
    s.add_argument("--histogram", metavar="NAME",
                   help="the latency histogram's name there (e.g. request_latency_seconds)")
    s.add_argument("--training", action="store_true",
                   help="a training job: no target; it shares the CPU left by the inference "
                        "services with the other training jobs, by the progress it reports "
                        "(FlowCon)")
    u = sub.add_parser("unset-target", help="remove a target and restore the container's limit")
    u.add_argument("container")
    ls = sub.add_parser("list", help="list targets")
    ls.add_argument("--json", action="store_true")
    st = sub.add_parser("status", help="show the controller's view")
    st.add_argument("container", nargs="?")
    view = st.add_mutually_exclusive_group()
    view.add_argument("--json", action="store_true")
    view.add_argument("--interference", action="store_true",
                      help="what slows the node and each container: pressure stalls (cpu, "
                           "memory, io), throttling, hardware counters where the host has "
                           "them")
    st.add_argument("--watch", nargs="?", type=_interval, const=1.0, metavar="SECONDS",
                    help="refresh every SECONDS (default 1) until interrupted")
    sub.add_parser("act", help="write the limits decided, from the next decision on")
    sub.add_parser("recommend", help="write no limit, give back those written; status shows "
                                     "what it would set")
    cl = sub.add_parser("cluster", help="the Swarm's view, from dqoes-manager")
    cl.add_argument("what", choices=["status", "act", "recommend"],
                    help="status: the view; act: make placement's updates; recommend: only "
                         "show them")
    cl.add_argument("--manager-socket", type=Path,
                    default=Path(os.environ.get("DQOES_MANAGER_SOCKET", MANAGER_SOCKET)),
                    help="dqoes-manager's control socket (default %(default)s, or "
                         "$DQOES_MANAGER_SOCKET)")
    cl.add_argument("--json", action="store_true")
    cl.add_argument("--watch", nargs="?", type=_interval, const=1.0, metavar="SECONDS",
                    help="refresh every SECONDS (default 1) until interrupted")
    return p


def _set_target(args: argparse.Namespace) -> dict[str, Any]:
    if (args.metrics is None) != (args.histogram is None):
        raise ValueError("--metrics and --histogram go together")
    if args.training:
        if args.target is not None or args.metric is not None or args.metrics is not None:
            raise ValueError("a training job has no target, metric or histogram: give "
                             "TARGET or --training")
        return request(args.socket, "set-target", container=args.container, training=True,
                       pending=args.pending)
    if args.target is None:
        raise ValueError("set-target needs a TARGET (or --training)")
    scrape = {} if args.metrics is None else {"metrics": args.metrics,
                                              "histogram": args.histogram}
    return request(args.socket, "set-target", container=args.container,
                   target_s=parse_duration(args.target), metric=args.metric or DEFAULT_METRIC,
                   pending=args.pending, **scrape)


def _run(args: argparse.Namespace) -> str:
    if args.command == "set-target":
        r = _set_target(args)
        state = "bound to " + r["cgroup"] if r["cgroup"] else "pending (container not found yet)"
        what = "a training job" if r.get("kind") == TRAINING else \
            f"target {format_duration(r['target_s'])} ({r['metric']})"
        if r.get("metrics"):
            return (f"{r['name']}: {what}, {state}\n"
                    f"latency from {r['metrics']} ({r['histogram']}), scraped at each window")
        return (f"{r['name']}: {what}, {state}\n"
                f"ring: {r['ring']}\n"
                f"mount it into the container, e.g.: docker run -v {r['ring_dir']}:/run/dqoes ...")
    if args.command == "unset-target":
        r = request(args.socket, "unset-target", container=args.container)
        restored = f", cpu.max restored to '{r['restored']}'" if r["restored"] else ""
        return f"{r['name']}: target removed{restored}"
    if args.command in ("act", "recommend"):
        request(args.socket, args.command)
        return ("acting: the limits decided are written" if args.command == "act" else
                "recommending: no limit is written (those written were given back); "
                "dqoesctl status shows what it would set")
    if args.command == "list":
        listed = _of_all(args.socket, "list", "entries")
        targets = listed if isinstance(listed, list) else listed["entries"]
        return json.dumps(targets, indent=1) if args.json else \
            format_list([Listing.from_json(t) for t in targets])
    if args.command == "cluster" and args.what in ("act", "recommend"):
        request(args.manager_socket, f"cluster-{args.what}")
        return ("acting: placement's updates are made" if args.what == "act" else
                "recommending: placement makes no update; dqoesctl cluster status shows "
                "what it would make")
    if args.command == "cluster":
        view = request(args.manager_socket, "cluster-status")
        return json.dumps(view, indent=1) if args.json else \
            format_cluster(ClusterView.from_json(view))
    status = (request(args.socket, "status", container=args.container) if args.container
              else _of_all(args.socket, "status", "containers"))
    if args.json:
        return json.dumps(status, indent=1)
    if args.interference:
        return format_interference(Status.from_json(status))
    return format_status(Status.from_json(status))


def _of_all(socket: Path, op: str, items: str) -> Any:
    """The reply to `op` for every container, asked for a page at a time: the last page's
    (the host's figures, for a status) with the `items` of every page. A daemon that knows
    no pages answers the first request whole (a reply with no 'next'): that reply."""
    shown: list[Any] = []
    cursor = None
    while True:
        page = request(socket, op, limit=MAX_LIMIT,
                       **({} if cursor is None else {"cursor": cursor}))
        if not isinstance(page, dict) or "next" not in page:
            return page
        shown += page[items]
        cursor = page.pop("next")
        if cursor is None:
            return {**page, items: shown}


def _interval(text: str) -> float:
    """--watch's SECONDS: a positive, finite number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        while True:
            out = _run(args)
            if getattr(args, "watch", None) is None:
                print(out)
                return 0
            print("\033[H\033[J" + time.strftime("%H:%M:%S  ") + "dqoes-cg\n" + out, flush=True)
            time.sleep(args.watch)
    except (ValueError, RequestError) as e:
        print(f"dqoesctl: {e}", file=sys.stderr)
        return EXIT_ERROR
    except DaemonUnavailable as e:
        print(f"dqoesctl: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
