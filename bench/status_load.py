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
3. pages: REQUESTS status of all asked a page of LIMITS at a time (paging.py), one after
   the other, as dqoesctl asks (each one's latency: all its pages; the size of each page);
4. at once: REQUESTS clients ask for status of all together (the requests of a tick share
   one status: snapshot.View);
5. a slow reader: one client asks for status of all and reads SLOW_CHUNK bytes every
   SLOW_EVERY_S, until the reply is read.

A daemon that knows no pages (an older one, measured for a baseline) answers the first
request of each whole, and the pages windows show that.

Writes DIR/status_load.json (default bench/results) and prints a table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.cgroups import Cgroups, tmpfs_dir
from bench.dqoesd import REQUEST_TIMEOUT_S, Dqoesd, interrupt_on_sigterm
from bench.timing import fmt_time, summarize
from dqoes_cg.control import PROTOCOL_VERSION, request
from dqoes_cg.jsonline import encode

ROOT = Path(__file__).resolve().parents[1]
ENTRIES = 10_000
BOUND = 2_500
REQUESTS = 5
WINDOW_S = 10.0
TICK_S = 0.5
SLOW_CHUNK = 64 << 10
SLOW_EVERY_S = 0.05
LIMITS = (500, 2000)  # paging.py's default and largest
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


def _size(result: object) -> int:
    """The size in bytes of the reply that carried `result`, encoded again as the daemon
    encodes it (compact, in the same order): measured after the window, not in it."""
    return len(encode({"version": PROTOCOL_VERSION, "ok": True, "result": result}))


def _paged(path: Path, limit: int) -> tuple[int, list[dict]]:
    """Status of all, a page of `limit` at a time: the containers shown, and the pages."""
    shown, pages, cursor = 0, [], None
    while True:
        page = request(path, "status", timeout=REQUEST_TIMEOUT_S, limit=limit, cursor=cursor)
        shown += len(page["containers"])
        pages.append(page)
        cursor = page.get("next")
        if cursor is None:
            return shown, pages


def _window(d: Dqoesd, ask: Callable[[], None], requests: int) -> dict[str, float | int]:
    """`ask` REQUESTS times, one after the other: each one's latency and the ticks."""
    latencies = []
    start = time.monotonic()
    for _ in range(requests):
        t0 = time.perf_counter()
        ask()
        latencies.append(time.perf_counter() - t0)
    end = time.monotonic()
    return {"median_s": summarize(latencies).median, "max_s": max(latencies),
            "longest_gap_s": _longest_gap(d, start, end),
            "ticks": len(d.ticks_between(start, end)), "window_s": end - start}


def _at_once(d: Dqoesd, entries: int, clients: int) -> dict[str, float | int]:
    """`clients` ask for status of all together: the slowest one's latency, the ticks."""
    latencies: list[float] = []
    go = threading.Barrier(clients)

    def one() -> None:
        go.wait()
        t0 = time.perf_counter()
        result = d.request("status")
        latencies.append(time.perf_counter() - t0)
        assert len(result["containers"]) == entries

    threads = [threading.Thread(target=one) for _ in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = time.monotonic()
    return {"max_s": max(latencies), "longest_gap_s": _longest_gap(d, start, end),
            "ticks": len(d.ticks_between(start, end)), "window_s": end - start}


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

        kept: list[dict] = []  # the replies to the first request of a window

        def whole() -> None:
            shown = d.request("status")
            assert len(shown["containers"]) == entries, len(shown["containers"])
            kept[:] = kept or [shown]

        def paged(limit: int) -> None:
            shown, pages = _paged(d.socket, limit)
            assert shown == entries, shown
            kept[:] = kept or pages

        status = _window(d, whole, requests)
        reply_bytes = _size(kept[0])
        pages = {}
        for limit in LIMITS:
            kept.clear()
            window = _window(d, lambda limit=limit: paged(limit), requests)
            sizes = [_size(page) for page in kept]
            pages[limit] = {**window, "pages": len(sizes), "page_bytes_max": max(sizes),
                            "page_bytes_median": summarize(sizes).median}
        kept.clear()
        at_once = _at_once(d, entries, requests)

        start = time.monotonic()
        size = _slow_read(d.socket)
        slow_end = time.monotonic()
        slow = _longest_gap(d, start, slow_end)
        return {"entries": entries, "bound": bound, "tick_s": TICK_S, "quiet_s": window_s,
                "longest_gap_quiet_s": quiet, "status_median_s": status["median_s"],
                "status_max_s": status["max_s"], "status_requests": requests,
                "longest_gap_status_s": status["longest_gap_s"],
                "ticks_during_status": status["ticks"], "status_window_s": status["window_s"],
                "reply_bytes": reply_bytes,
                "pages": {str(k): v for k, v in pages.items()}, "at_once": at_once,
                "slow_read_s": slow_end - start, "slow_read_bytes": size,
                "longest_gap_slow_read_s": slow, "daemon_rss_mb": d.memory_mb()["VmRSS"]}


def table(r: dict) -> str:
    lines = [
        f"{r['entries']:,} entries ({r['bound']:,} bound), ticks every {r['tick_s']} s:", "",
        "| window | status of all | reply | longest gap between ticks |", "|---|---|---|---|",
        f"| quiet, {r['quiet_s']:.0f} s | - | - | {fmt_time(r['longest_gap_quiet_s'])} |",
        f"| {r['status_requests']} status of all in one reply, one after the other "
        f"({r['ticks_during_status']} ticks in {r['status_window_s']:.1f} s) | "
        f"{fmt_time(r['status_median_s'])} median, {fmt_time(r['status_max_s'])} max | "
        f"{r['reply_bytes'] / 1e6:.1f} MB | {fmt_time(r['longest_gap_status_s'])} |"]
    for limit, p in r["pages"].items():
        lines.append(
            f"| {r['status_requests']} status of all in pages of {limit} ({p['pages']} "
            f"pages; {p['ticks']} ticks in {p['window_s']:.1f} s) | "
            f"{fmt_time(p['median_s'])} median, {fmt_time(p['max_s'])} max | "
            f"{p['page_bytes_median'] / 1e3:.0f} KB a page median, "
            f"{p['page_bytes_max'] / 1e3:.0f} KB max | {fmt_time(p['longest_gap_s'])} |")
    a = r["at_once"]
    lines += [
        f"| {r['status_requests']} status of all in one reply, at once ({a['ticks']} ticks "
        f"in {a['window_s']:.1f} s) | {fmt_time(a['max_s'])} the slowest | - | "
        f"{fmt_time(a['longest_gap_s'])} |",
        f"| a slow reader ({r['slow_read_bytes'] / 1e6:.1f} MB in {r['slow_read_s']:.1f} s)"
        f" | - | - | {fmt_time(r['longest_gap_slow_read_s'])} |", ""]
    return "\n".join(lines)


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
