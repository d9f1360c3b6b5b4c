"""Prometheus metrics (opt-in): the controller's status as a text exposition over HTTP.

`dqoesd --metrics-listen [ADDR:]PORT` serves GET /metrics from a thread of its own, on
127.0.0.1 unless ADDR names another address. Each scrape takes one snapshot of the
controller's status (the daemon's loop holds the same lock while it ticks, so the arrays are
never read half-updated) and renders it in the text format, version 0.0.4:

    per container  target, measured latency, class, CPU limit and usage, throttling, samples,
                   foreign writes of its cpu.max and cpu.weight, whether it is contested; for a
                   training job, its list (as its class), evaluation value and growth
                   efficiency
    per host       containers per class, ticks, decisions, reconcile corrections, ring faults
                   and lost records, systemd updates, the CPU budget and the listener's interval
"""

from __future__ import annotations

import logging
import math
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from .state import TRAINING
from .status import CLASSES, Status

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_HOST = "127.0.0.1"
CLIENT_TIMEOUT_S = 5.0

Snapshot = Callable[[], Status]


def parse_listen(text: str) -> tuple[str, int]:
    """'9750' -> ('127.0.0.1', 9750); '0.0.0.0:9750'; '[::1]:9750' -> ('::1', 9750)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host = DEFAULT_HOST
    elif host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or not 0 < int(port) < 65536 or (sep and not host):
        raise ValueError(f"bad metrics address {text!r}: use PORT, ADDR:PORT or [ADDR6]:PORT")
    return host, int(port)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value(x: float | None) -> str:
    if x is None or math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x)) if isinstance(x, float) else str(x)


class _Family:
    """One metric family: its HELP and TYPE lines and its samples."""

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name, self.kind, self.help = name, kind, help_text
        self.samples: list[tuple[dict[str, str], float | None]] = []

    def add(self, value: float | None, **labels: str) -> None:
        self.samples.append((labels, value))

    def lines(self) -> Iterator[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.kind}"
        for labels, value in self.samples:
            text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            yield f"{self.name}{{{text}}} {_value(value)}" if text else \
                f"{self.name} {_value(value)}"


def render(status: Status) -> str:
    """The text exposition of a status snapshot."""
    def family(name: str, kind: str, help_text: str) -> _Family:
        f = _Family(f"dqoes_{name}", kind, help_text)
        families.append(f)
        return f

    families: list[_Family] = []
    target = family("container_target_seconds", "gauge", "QoE target of the container")
    measured = family("container_latency_seconds", "gauge",
                      "Latency statistic (the target's metric) of the last decision window")
    cls = family("container_class", "gauge",
                 "1 for the container's class: G (beats its target), S (meets it), "
                 "B (misses it), idle (no requests), pending (no cgroup bound yet); a training "
                 "job's list: NL (new), WL (watching), CL (completing)")
    limit = family("container_cpu_limit_cores", "gauge",
                   "CPU limit in force (cpu.max) in CPUs; +Inf when unlimited")
    usage = family("container_cpu_usage_cores", "gauge", "CPU usage over the last tick, in CPUs")
    throttled = family("container_throttled_ratio", "gauge",
                       "Share of CFS periods throttled over the last tick")
    samples = family("container_window_samples", "gauge",
                     "Latency records in the last decision window")
    foreign = family("container_foreign_writes_total", "counter",
                     "cpu.max and cpu.weight values written by someone else in place of "
                     "the daemon's")
    contested = family("container_contested", "gauge",
                       "1 while the container's cpu.max or cpu.weight is left to another "
                       "writer")
    evaluation = family("container_evaluation", "gauge",
                        "A training job's latest evaluation value (its loss, accuracy...)")
    growth = family("container_growth_efficiency", "gauge",
                    "A training job's growth efficiency at the last decision: progress of its "
                    "evaluation value per second, per fraction of the CPU budget used")
    for c in status.containers:
        name = c.name
        training = c.kind == TRAINING
        if not training:
            target.add(c.target_s, container=name, metric=c.metric or "")
        for k in CLASSES:
            cls.add(1 if c.cls == k else 0, container=name, **{"class": k})
        if c.cls == "pending":
            continue
        if training:
            evaluation.add(c.evaluation, container=name)
            growth.add(c.growth_efficiency, container=name)
        else:
            measured.add(c.measured_s, container=name, metric=c.metric or "")
        limit.add(math.inf if c.cpu_limit_cores is None else c.cpu_limit_cores,
                  container=name)
        usage.add(c.cpu_usage_cores, container=name)
        throttled.add(c.throttled_ratio, container=name)
        samples.add(c.samples, container=name)
        foreign.add(c.foreign_writes, container=name)
        contested.add(int(c.contested), container=name)

    h = status.host
    containers = family("containers", "gauge", "Containers with a target, by class")
    for k in CLASSES:
        containers.add(getattr(h, k), **{"class": k})
    for name, value, help_text in (
            ("ticks_total", h.ticks, "Ticks of the control loop"),
            ("decisions_total", h.decisions, "Decisions of the policy"),
            ("reconcile_corrections_total", h.reconcile_corrections,
             "Limits found changed by someone else and written again"),
            ("ring_faults_total", h.ring_faults, "Faults met reading latency rings"),
            ("ring_lost_records_total", h.ring_lost,
             "Latency records lost to overruns, torn or invalid slots")):
        family(name, "counter", help_text).add(value)
    updates = family("systemd_updates_total", "counter",
                     "CPU limits of systemd units sent to systemd, by result")
    updates.add(h.systemd_sent, result="sent")
    updates.add(h.systemd_failed, result="failed")
    family("budget_cpus", "gauge", "CPU budget T_R of the managed containers").add(
        h.budget_cpus)
    family("interval_seconds", "gauge", "Current interval of the adaptive listener").add(
        h.interval_s)
    family("last_decision_timestamp_seconds", "gauge",
           "Unix time of the last decision (NaN: none yet)").add(h.last_decision_unix)
    return "\n".join(line for f in families for line in f.lines()) + "\n"


class MetricsServer:
    """GET /metrics on (host, port), served by one background thread."""

    def __init__(self, address: tuple[str, int], snapshot: Snapshot) -> None:
        handler = type("Handler", (_Handler,), {"snapshot": staticmethod(snapshot)})
        server_class = type("Server", (HTTPServer,), {
            "address_family": _family_of(address[0])})
        self._server = server_class(address, handler)
        self.address = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="dqoes-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _family_of(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


class _Handler(BaseHTTPRequestHandler):
    snapshot: Snapshot
    timeout = CLIENT_TIMEOUT_S  # a client that sends nothing holds the thread this long
    server_version = "dqoesd"

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404, "only /metrics is served here")
            return
        try:
            body = render(self.snapshot()).encode()
        except Exception:  # a bug must not take the thread down with it
            log.exception("metrics: rendering failed")
            self.send_error(500)
            return
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics: %s %s", self.address_string(), format % args)
