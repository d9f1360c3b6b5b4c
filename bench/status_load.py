"""The loop while status is asked for: how long a real dqoesd's ticks stop, and how long a
status of all takes, with ENTRIES targets.

    python3 -m bench.status_load [--entries 10000] [--bound 2500] [--requests 5] [--out DIR]

Over a fake cgroup tree on tmpfs (bench/cgroups.py), BOUND cgroups get a target by path and
container names that exist nowhere get one --pending, ENTRIES in all: status shows every
one (the pending names are looked for off the loop, bench/scale.py). A bound target holds
seven descriptors, and the host's hard limit of 20,000, which may not be raised, holds
2,784 targets: the daemon here counts only the bound ones against it. With 0.5 s ticks,
the gaps between ticks (the daemon's WATCHDOG=1 notifications) are taken over three windows:

1. quiet: WINDOW_S without a request;
2. status: REQUESTS status of all, one after the other (each one's latency as the client
   sees it: connect, request, the whole reply);
3. a slow reader: one client asks for status of all and reads SLOW_CHUNK bytes every
   SLOW_EVERY_S, until the reply is read.

Writes DIR/status_load.json (default bench/results) and prints a table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

from bench.cgroups import Cgroups, tmpfs_dir
from bench.dqoesd import Dqoesd, interrupt_on_sigterm
from bench.timing import fmt_time, summarize
from dqoes_cg.control import PROTOCOL_VERSION
from dqoes_cg.jsonline import encode

ROOT = Path(__file__).resolve().parents[1]
ENTRIES = 10_000
BOUND = 2_500
REQUESTS = 5
WINDOW_S = 10.0
TICK_S = 0.5
SLOW_CHUNK = 64 << 10
SLOW_EVERY_S = 0.05
BOUND_TIMEOUT_S = 600.0

# The daemon, with room for every target however many descriptors the host allows: the
# pending ones hold none.
_ROOMY = """
import sys
from dqoes_cg import controller
room = int(sys.argv.pop(1))
controller.open_file_limit = lambda: controller.FD_RESERVE + controller.FDS_PER_TARGET * room
from dqoes_cg.daemon import main
sys.exit(main(sys.argv[1:]))
"""


def _longest_gap(d: Dqoesd, start: float, end: float) -> float:
    """The longest stretch between `start`, the ticks notified until `end`, and `end`."""
    times = [start, *d.ticks_between(start, end), end]
    return max(b - a for a, b in itertools.pairwise(times))


def _slow_read(path: Path) -> int:
    """Ask for status of all and read the reply SLOW_CHUNK bytes at a time; its size."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_CHUNK)
        s.settimeout(120)
        s.connect(str(path))
        s.sendall(encode({"version": PROTOCOL_VERSION, "op": "status"}))
        size = 0
        while chunk := s.recv(SLOW_CHUNK):
            size += len(chunk)
            if chunk.endswith(b"\n"):
                break
            time.sleep(SLOW_EVERY_S)
        return size


def run(entries: int, bound: int, requests: int, window_s: float) -> dict[str, float | int]:
    with (Cgroups(bound, None, processes=0) as cgroups,
          tempfile.TemporaryDirectory(prefix="dqoes-bench-status-", dir=tmpfs_dir()) as tmp,
          Dqoesd(Path(tmp), cgroups.mount, "--sample-interval", str(TICK_S),
                 command=(sys.executable, "-c", _ROOMY, str(entries))) as d):
        for p in cgroups.dirs:
            d.request("set-target", container=str(p.relative_to(cgroups.mount)),
                      target_s=0.1, metric="p95")
        for k in range(entries - bound):
            d.request("set-target", container=f"absent-{k}", target_s=0.1,
                      metric="p95", pending=True)
        deadline = time.monotonic() + BOUND_TIMEOUT_S
        while not d.status_line.startswith(f"{bound} bound,"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"not every target was bound: {d.status_line}")
            time.sleep(0.1)

        start = time.monotonic()
        time.sleep(window_s)
        quiet = _longest_gap(d, start, time.monotonic())

        latencies, size = [], 0
        start = time.monotonic()
        for _ in range(requests):
            t0 = time.perf_counter()
            shown = d.request("status")
            latencies.append(time.perf_counter() - t0)
            assert len(shown["containers"]) == entries, len(shown["containers"])
        end = time.monotonic()
        during = _longest_gap(d, start, end)
        ticks = len(d.ticks_between(start, end))
        status_window = end - start

        start = time.monotonic()
        size = _slow_read(d.socket)
        slow_end = time.monotonic()
        slow = _longest_gap(d, start, slow_end)
        stats = summarize(latencies)
        return {"entries": entries, "bound": bound, "tick_s": TICK_S, "quiet_s": window_s,
                "longest_gap_quiet_s": quiet, "status_median_s": stats.median,
                "status_max_s": max(latencies), "status_requests": requests,
                "longest_gap_status_s": during, "ticks_during_status": ticks,
                "status_window_s": status_window, "reply_bytes": size,
                "slow_read_s": slow_end - start, "longest_gap_slow_read_s": slow,
                "daemon_rss_mb": d.memory_mb()["VmRSS"]}


def table(r: dict[str, float | int]) -> str:
    return "\n".join([
        f"{r['entries']:,} entries ({r['bound']:,} bound), ticks every {r['tick_s']} s:", "",
        "| window | status of all | longest gap between ticks |", "|---|---|---|",
        f"| quiet, {r['quiet_s']:.0f} s | - | {fmt_time(r['longest_gap_quiet_s'])} |",
        f"| {r['status_requests']} status of all, one after the other "
        f"({r['ticks_during_status']} ticks in {r['status_window_s']:.1f} s) | "
        f"{fmt_time(r['status_median_s'])} median, {fmt_time(r['status_max_s'])} max | "
        f"{fmt_time(r['longest_gap_status_s'])} |",
        f"| a slow reader ({r['reply_bytes'] / 1e6:.1f} MB in {r['slow_read_s']:.1f} s) | - | "
        f"{fmt_time(r['longest_gap_slow_read_s'])} |", ""])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.status_load",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=ENTRIES)
    p.add_argument("--bound", type=int, default=BOUND)
    p.add_argument("--requests", type=int, default=REQUESTS)
    p.add_argument("--window", type=float, default=WINDOW_S, help="seconds of the quiet window")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args(argv)
    interrupt_on_sigterm()
    result = run(args.entries, min(args.bound, args.entries), args.requests, args.window)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "status_load.json").write_text(json.dumps(result, indent=1))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
