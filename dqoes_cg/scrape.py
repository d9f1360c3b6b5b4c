"""Latencies from the Prometheus histograms that services export (sense), for the targets
that name one (`Scrape`, membership/objective.py) instead of a ring.

Once per decision window the loop asks (`Scraper.kick`, a tick and TIMEOUT_S before the
window closes, so that the readings are in when it closes: one still out then goes into
the next window, with the readings after it), and the scraper's thread fetches every such
service's metrics, at most WORKERS at a time, off the loop: at 127.0.0.1:PORT inside the
container's network namespace, entered by a short-lived thread of its own (setns applies
to the calling thread alone; the thread makes the socket there and ends, so no other
thread ever changes namespace), through the /proc entry of a process that is checked to
be in the container's cgroup. The answer is
hostile input: TIMEOUT_S for all of it (connect, request, answer), at most MAX_ANSWER
bytes, plain HTTP (no chunks, no compression), parsed by prometheus_client's parser; a
failure costs that container its reading of this window, with one line in the log (again
only when the reason changes, or after LOG_EVERY_S). Each reading's difference with the
one before is the window's statistics (histogram.py), which the fleet takes when the window
closes (`fill`, numpy on arrays held ready: no per-container work on the loop).
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from .cgroup import CRUN_SUBGROUP
from .histogram import Reading, window
from .membership.objective import Scrape
from .ring import STATS

log = logging.getLogger(__name__)

WORKERS = 4
"""Scrapes at a time."""
TIMEOUT_S = 3.0
"""For the whole of one scrape: connecting, sending the request, reading the answer (at
most; the daemon's is also at most a third of its shortest window, `timeout_for`). A
container throttled hard serves its own metrics slowly: at 1 s, one cut to 0.05-0.15 CPU
beside a busy worker in the kernel test missed its scrapes, so it looked idle and stayed
starved (Prometheus's own default is 10 s)."""
MAX_ANSWER = 1 << 20
"""Bytes of an answer (headers and metrics) read at most."""
MAX_SERIES = 1000
"""Label sets of the histogram added up at most."""
MAX_BUCKETS = 200
"""Buckets of one label set at most."""
PIDS_TRIED = 4
"""Processes of a cgroup tried in turn (one may exit between its listing and its use)."""
LOG_EVERY_S = 60.0
"""A container's failure that goes on is logged again after this long."""
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class ScrapeError(Exception):
    """A scrape that failed; a one-line reason."""


@dataclass(frozen=True)
class Job:
    """A target scraped: its name, cgroup (directory), where its histogram is, and the
    statistic it is pursued for (whose error bound status shows)."""

    name: str
    cgroup: str
    scrape: Scrape
    metric: str


# --- one scrape --------------------------------------------------------------------------


def timeout_for(window_s: float) -> float:
    """A scrape's timeout for windows of at least `window_s`: a third of it, at most
    TIMEOUT_S, so that a scrape kicked that long and a tick before the window closes has
    ended when it does, with room for a window shortened by the loop's ticks."""
    return min(TIMEOUT_S, window_s / 3.0)


def scrape(job: Job, mount: Path | None, timeout: float = TIMEOUT_S,
           limit: int = MAX_ANSWER) -> Reading:
    """A reading of `job`'s histogram, fetched in its cgroup's network namespace (in this
    one when `mount` is None: tests). ScrapeError if it cannot be had."""
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM) if mount is None else \
        socket_in_netns(Path(job.cgroup), mount)
    with sock:
        body = http_get(sock, job.scrape.port, job.scrape.path, deadline, limit)
    return parse(body, job.scrape.histogram)


def socket_in_netns(cgroup: Path, mount: Path) -> socket.socket:
    """A TCP socket made in the network namespace of a process of `cgroup`, or of crun's
    subgroup of it (CRUN_SUBGROUP), where a container with a delegated cgroup runs."""
    pids = _pids(cgroup)
    if not pids and (cgroup / CRUN_SUBGROUP).is_dir():
        cgroup = cgroup / CRUN_SUBGROUP
        pids = _pids(cgroup)
    if not pids:
        raise ScrapeError("no process in its cgroup")
    why = "its processes left it"
    for pid in pids:
        try:
            return _socket_of(int(pid), cgroup, mount)
        except (OSError, ValueError) as e:
            why = f"process {pid.decode(errors='replace')[:12]}: {e}"
    raise ScrapeError(f"cannot enter its network namespace: {why}")


def _pids(cgroup: Path) -> list[bytes]:
    """The first PIDS_TRIED processes of `cgroup`."""
    try:
        fd = os.open(cgroup / "cgroup.procs", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            return os.read(fd, 4096).split()[:PIDS_TRIED]
        finally:
            os.close(fd)
    except OSError as e:
        raise ScrapeError(f"cannot list its processes: {e.strerror}") from None


def _socket_of(pid: int, cgroup: Path, mount: Path) -> socket.socket:
    """A socket in the network namespace of process `pid`, which must be in `cgroup`: its
    /proc directory is held open, so that a pid reused meanwhile fails instead."""
    proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if _cgroup_of(proc, mount) != cgroup:  # before touching its namespace at all
            raise ValueError("not in its cgroup")
        netns = os.open("ns/net", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
        try:
            # again once the namespace is open: a process that moved or ended meanwhile
            # fails it, so the namespace is of one that was in the cgroup
            if _cgroup_of(proc, mount) != cgroup:
                raise ValueError("not in its cgroup")
            return _socket_in(netns)
        finally:
            os.close(netns)
    finally:
        os.close(proc)


def _cgroup_of(proc: int, mount: Path) -> Path | None:
    """The cgroup v2 directory of the process whose /proc directory is `proc`."""
    fd = os.open("cgroup", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    try:
        text = os.read(fd, 65536).decode(errors="replace")
    finally:
        os.close(fd)
    for line in text.splitlines():
        if line.startswith("0::/"):
            return mount / line[4:].rstrip("\n")
    return None


def _socket_in(netns: int) -> socket.socket:
    """A TCP socket made by a thread of its own that entered `netns` and ends then."""
    made: list[socket.socket | OSError] = []

    def make() -> None:
        try:
            if _libc.setns(netns, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns: {os.strerror(err)}")
            made.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        except OSError as e:
            made.append(e)

    helper = threading.Thread(target=make, name="dqoes-netns", daemon=True)
    helper.start()
    helper.join()
    if not made or isinstance(made[0], OSError):
        raise made[0] if made else OSError("the thread made no socket")
    return made[0]


def http_get(sock: socket.socket, port: int, path: str, deadline: float,
             limit: int = MAX_ANSWER) -> str:
    """The body of a plain HTTP/1.0 GET of http://127.0.0.1:port/path on `sock`, all of
    it before `deadline` (monotonic) and within `limit` bytes."""
    allowed = deadline - time.monotonic()

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ScrapeError(f"no whole answer within {allowed:.1f} s")
        return left

    try:
        sock.settimeout(remaining())
        sock.connect(("127.0.0.1", port))
        sock.settimeout(remaining())
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n"
                     "Accept: text/plain;version=0.0.4\r\nConnection: close\r\n\r\n".encode())
        chunks, size = [], 0
        while True:
            sock.settimeout(remaining())
            chunk = sock.recv(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise ScrapeError(f"answer larger than {limit:,} bytes")
            chunks.append(chunk)
    except TimeoutError:
        raise ScrapeError(f"no whole answer within {allowed:.1f} s") from None
    except OSError as e:
        raise ScrapeError(f"127.0.0.1:{port}: {e.strerror or e}") from None
    head, sep, body = b"".join(chunks).partition(b"\r\n\r\n")
    if not sep:
        raise ScrapeError("not an HTTP answer")
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(" ", 2)
    if len(status) < 2 or not status[0].startswith("HTTP/"):
        raise ScrapeError(f"not an HTTP answer: {lines[0][:60]!r}")
    if status[1] != "200":
        raise ScrapeError(f"HTTP {lines[0][:60]}")
    headers = {k.strip().lower(): v.strip().lower()
               for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding", "identity") != "identity" or \
            headers.get("content-encoding", "identity") != "identity":
        raise ScrapeError("an encoded answer (only plain text is read)")
    try:
        return body.decode()
    except UnicodeDecodeError:
        raise ScrapeError("the answer is not UTF-8 text") from None


def parse(text: str, histogram: str) -> Reading:
    """The reading of histogram `histogram` in an exposition, its label sets added up
    (they must share their buckets). ScrapeError if it is not there or malformed."""
    try:
        family = next((f for f in text_string_to_metric_families(text)
                       if f.name == histogram), None)
        if family is None:
            raise ScrapeError(f"no metric {histogram} there")
        if family.type != "histogram":
            raise ScrapeError(f"{histogram} is a {family.type[:20]}, not a histogram")
        return _reading(histogram, family.samples)
    except ScrapeError:
        raise
    except Exception as e:  # the parser's own errors, on whatever the service sent
        raise ScrapeError(f"malformed metrics: {str(e)[:80]}") from None


def _reading(name: str, samples: Iterable[object]) -> Reading:
    buckets: dict[tuple, dict[float, float]] = {}
    count = total = 0.0
    for s in samples:
        value = float(s.value)  # type: ignore[attr-defined]
        if not (np.isfinite(value) and value >= 0):
            raise ScrapeError(f"{name}: a value that is not a count: {value}")
        labels = dict(s.labels)  # type: ignore[attr-defined]
        if s.name == name + "_bucket":  # type: ignore[attr-defined]
            le = float(labels.pop("le", "nan"))
            series = buckets.setdefault(tuple(sorted(labels.items())), {})
            if len(buckets) > MAX_SERIES or len(series) >= MAX_BUCKETS:
                raise ScrapeError(f"{name}: more than {MAX_SERIES} label sets or "
                                  f"{MAX_BUCKETS} buckets")
            series[le] = value
        elif s.name == name + "_count":  # type: ignore[attr-defined]
            count += value
        elif s.name == name + "_sum":  # type: ignore[attr-defined]
            total += value
    if not buckets:
        raise ScrapeError(f"{name} has no buckets")
    bounds = sorted(next(iter(buckets.values())))
    if any(sorted(series) != bounds for series in buckets.values()):
        raise ScrapeError(f"{name}: label sets with different buckets")
    if bounds[-1] != np.inf or np.isnan(bounds).any():
        raise ScrapeError(f"{name}: no +Inf bucket")
    cumulative = np.array([[series[b] for b in bounds] for series in buckets.values()])
    if (np.diff(cumulative, axis=1) < 0).any():
        raise ScrapeError(f"{name}: bucket counts that are not cumulative")
    return Reading(np.array(bounds), cumulative.sum(axis=0), count, total)


# --- the scraper -------------------------------------------------------------------------


class Scraper:
    """Scrapes the targets it is given (`assign`, with their slots in the fleet) when
    kicked, at most once per window, in a thread of its own with a pool of WORKERS; `fill`
    puts the windows ready into the fleet's window arrays (the rows of STATS, and the
    counts), consuming them. `errors` and `error_s`: per target, why its last scrape failed
    and the error bound of its statistic in the last reading (for status)."""

    def __init__(self, mount: Path | None, workers: int = WORKERS,
                 timeout: float = TIMEOUT_S, limit: int = MAX_ANSWER) -> None:
        self.mount, self.workers, self.timeout, self.limit = mount, workers, timeout, limit
        self.errors: dict[str, str] = {}
        self.error_s: dict[str, float] = {}
        self.rounds = 0  # rounds done
        self._lock = threading.Lock()
        self._jobs: list[Job] = []
        self._index: dict[str, int] = {}
        self._slots = np.zeros(0, np.intp)
        self._count = np.zeros(0, np.int64)
        self._stats = np.zeros((len(STATS), 0))
        self._generation = 0  # windows filled
        self._base: dict[str, Reading] = {}  # where the row held ready starts
        self._latest: dict[str, tuple[Reading, int]] = {}  # the last reading, its window
        self._logged: dict[str, float] = {}
        self._wake = threading.Event()
        self._closed = False
        self._kicked = False
        self._thread: threading.Thread | None = None

    def __len__(self) -> int:
        return len(self._jobs)

    def assign(self, jobs: list[tuple[int, Job]]) -> None:
        """The targets to scrape from now on, each with its slot in the fleet; the windows
        held ready for those that stay are kept (membership changes, not the hot path)."""
        with self._lock:
            old = self._index
            rows = [old.get(job.name, -1) for _, job in jobs]
            count, stats = np.zeros(len(jobs), np.int64), np.full((len(STATS), len(jobs)),
                                                                  np.nan)
            for k, j in enumerate(rows):
                if j >= 0:
                    count[k], stats[:, k] = self._count[j], self._stats[:, j]
            self._jobs = [job for _, job in jobs]
            self._index = {job.name: k for k, job in enumerate(self._jobs)}
            self._slots = np.array([slot for slot, _ in jobs], np.intp)
            self._count, self._stats = count, stats
            for kept in (self._base, self._latest, self.errors, self.error_s, self._logged):
                for name in set(kept) - set(self._index):
                    del kept[name]
        if jobs and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="dqoes-scraper",
                                            daemon=True)
            self._thread.start()

    def kick(self) -> None:
        """Scrape every target once for the window that is closing (once per window)."""
        if self._jobs and not self._kicked:
            self._kicked = True
            self._wake.set()

    def fill(self, count: np.ndarray, stats: np.ndarray) -> None:
        """Put the windows ready into the fleet's arrays: `count` per slot, `stats` one
        row per name in STATS; a target with none has no reading (count 0, NaN)."""
        self._kicked = False
        if not len(self._slots):
            return
        with self._lock:
            count[self._slots] = self._count
            stats[:, self._slots] = self._stats
            self._count.fill(0)
            self._stats.fill(np.nan)
            self._generation += 1

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.timeout)

    def _run(self) -> None:
        with ThreadPoolExecutor(self.workers, thread_name_prefix="dqoes-scrape") as pool:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._closed:
                    return
                try:
                    self._round(pool)
                except Exception:  # a bug must not end the scraping for good
                    log.exception("scraping failed")

    def _round(self, pool: ThreadPoolExecutor) -> None:
        with self._lock:
            jobs = list(self._jobs)
        futures = {pool.submit(scrape, job, self.mount, self.timeout, self.limit): job
                   for job in jobs}
        for done in as_completed(futures):
            job = futures[done]
            try:
                self._take(job, done.result())
            except ScrapeError as e:
                self._failed(job.name, str(e))
            except Exception as e:  # whatever a service sent must not stop the others
                self._failed(job.name, f"{type(e).__name__}: {str(e)[:80]}")
        self.rounds += 1

    def _take(self, job: Job, reading: Reading) -> None:
        """A reading: the window held ready for `job` now runs from its start to it (from
        the last reading taken into a window, if that one was)."""
        with self._lock:
            k = self._index.get(job.name)
            if k is None or self._jobs[k] != job:
                return  # no longer scraped, or scraped from elsewhere now
            latest = self._latest.get(job.name)
            if latest is not None and latest[1] < self._generation:
                self._base[job.name] = latest[0]  # its window was taken: the next one
            self._latest[job.name] = (reading, self._generation)
            base = self._base.setdefault(job.name, reading)
            w = window(base, reading)
            if w is None:  # a restart: start over from this reading
                self._base[job.name] = reading
                log.info("%s: its histogram %s started over", job.name, job.scrape.histogram)
            else:
                self._count[k], self._stats[:, k] = w.count, w.stats
                bound = w.error[STATS.index(job.metric)]
                self.error_s[job.name] = float(bound)
            if self.errors.pop(job.name, None) is not None:
                log.info("%s: scraping %s works again", job.name, job.scrape)

    def _failed(self, name: str, why: str) -> None:
        now = time.monotonic()
        with self._lock:
            if name not in self._index:
                return
            again = self.errors.get(name) == why and now - self._logged.get(name, 0) < LOG_EVERY_S
            self.errors[name] = why
            if not again:
                self._logged[name] = now
        if not again:
            log.warning("%s: scrape failed, no reading this window: %s", name, why)
