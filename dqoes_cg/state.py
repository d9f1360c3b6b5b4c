"""The daemon's persistent state, the journal of membership: its targets (Target,
membership/objective.py), the cgroups they are bound to, and the limits it must give back.
It stores what membership/targets.py decides.

Two files under --state-dir:

    state.json   a snapshot: {"version": 2, "targets": [Target, ...]}
    state.log    the changes since, one JSON line each: {"put": Target} or {"del": name}

A change is one append of its lines to state.log, written whole and fsynced before the
caller changes anything in memory, so that a request costs the same with 10 targets as with
10,000, and a failed write (a full disk) changes nothing: the log is cut back to where it
was and the caller gets a `StateError`. A batch of changes may be appended unsynced
(`sync=False`) and made durable together by `sync` (one fsync for a burst of containers),
before anything acts on them; if that fails, they are cut from the log and the caller
undoes them. When the log has grown to the size of the state,
`compact` writes a new snapshot: to a temporary file, written whole, fsynced, read back and
parsed, then renamed over the old one, whose previous version stays as state.json.prev;
only then is the log emptied. A crash at any point leaves a snapshot and a log whose replay
gives the last acknowledged state (replaying a line twice changes nothing); a torn last
line (a crash mid-append, never acknowledged) is ignored.

A target bound to a cgroup records the cgroup's identity (the boot and the directory's
inode: cgroupfs never reuses one within a boot), so that a cgroup removed and re-created
under the same path while the daemon was down is not taken for the old one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, NamedTuple

from .membership.objective import SOURCES, Target, check_target, scrape_from

log = logging.getLogger(__name__)

STATE_VERSION = 5
# version 1: no log, no source, no cgroup identity; 2: no kind; 3: no original_weight;
# 4: no metrics, histogram
READABLE_VERSIONS = (1, 2, 3, 4, 5)
COMPACT_MIN_LINES = 256
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class StateError(Exception):
    """The state could not be written; nothing was changed. A one-line message."""


class Originals(NamedTuple):
    """What a cgroup held before the daemon's first write to each file; None: not known
    (never written, or not what is being recorded)."""

    cpu_max: str | None
    weight: int | None


_TARGET_FIELDS = frozenset(f.name for f in fields(Target))


def cgroup_identity(path: str | os.PathLike[str]) -> str:
    """The identity of the cgroup directory at `path`: "<boot id>:<inode>"; OSError if
    it is gone."""
    return f"{boot_id()}:{os.stat(path, follow_symlinks=False).st_ino}"


_boot_id: str | None = None


def boot_id() -> str:
    global _boot_id
    if _boot_id is None:
        try:
            _boot_id = BOOT_ID.read_text().strip()
        except OSError:
            _boot_id = "unknown"
    return _boot_id


def _target(item: Any) -> Target:
    if not isinstance(item, dict) or not set(item) <= _TARGET_FIELDS:
        raise ValueError(f"not a target: {item!r:.80}")
    t = Target(**item)
    if not isinstance(t.name, str) or not t.name:
        raise ValueError("a target without a name")
    check_target(t.target_s, t.metric, t.kind, scrape_from(t.metrics, t.histogram))
    if t.source not in SOURCES:
        raise ValueError(f"unknown source {t.source!r}")
    if t.ring is not None and not (isinstance(t.ring, str) and t.ring.startswith("/")):
        raise ValueError(f"not a ring path: {t.ring!r:.80}")
    if t.original_weight is not None and not (
            type(t.original_weight) is int and 1 <= t.original_weight <= 10_000):
        raise ValueError(f"not a cpu.weight: {t.original_weight!r:.80}")
    return t


class StateStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / "state.json"
        self.log_path = directory / "state.log"
        self._log_fd: int | None = None
        self._log_lines = 0
        self._unsynced_from: int | None = None  # where the appends not fsynced yet begin
        self._unsynced_lost: str | None = None  # why they were cut from the log

    # --- reading -----------------------------------------------------------------------

    def load(self) -> dict[str, Target]:
        """The state of the last run: its snapshot (or the previous one, if it is
        unreadable) with the log replayed, then compacted. A file that cannot be read is
        kept aside under a new name, never silently lost."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        targets = self._read_snapshot(self.path)
        if targets is None:
            targets = self._read_snapshot(self.path.with_name("state.json.prev")) or {}
        self._replay(targets)
        self.compact(targets)
        return targets

    def _read_snapshot(self, path: Path) -> dict[str, Target] | None:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return {} if path == self.path else None
        try:
            return _parse_snapshot(raw)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            os.replace(path, aside)
            log.error("state file %s unreadable (%s); moved to %s", path, e, aside)
            return None

    def _replay(self, targets: dict[str, Target]) -> None:
        try:
            lines = self.log_path.read_bytes().split(b"\n")
        except FileNotFoundError:
            return
        for k, line in enumerate(lines):
            if not line:
                continue
            try:
                change = json.loads(line)
                if "put" in change:
                    t = _target(change["put"])
                    targets[t.name] = t
                elif isinstance(change.get("del"), str):
                    targets.pop(change["del"], None)
                else:
                    raise ValueError("neither put nor del")
            except (ValueError, TypeError, AttributeError, RecursionError) as e:
                if k != len(lines) - 1:  # a torn last line (no newline) was never acknowledged
                    log.error("state log line %d unreadable (%s); the changes after it are "
                              "lost", k + 1, e)
                return

    # --- writing -----------------------------------------------------------------------

    def put(self, *targets: Target, sync: bool = True) -> None:
        """Record these targets as they are now (added or changed); StateError if it
        could not be written, and then nothing was. With `sync=False` they are written but
        durable only after `sync` (or any synced change, or a compaction)."""
        self._append([{"put": asdict(t)} for t in targets], sync)

    @property
    def unsynced(self) -> bool:
        """Whether changes written with `sync=False` are not durable yet."""
        return self._unsynced_from is not None

    def sync(self) -> None:
        """Make the changes written with `sync=False` durable. StateError: they are not,
        and were cut from the log (the caller must undo them)."""
        if self._unsynced_from is None:
            return
        start, lost = self._unsynced_from, self._unsynced_lost
        self._unsynced_from = self._unsynced_lost = None
        if lost is None:
            try:
                os.fsync(self._log())
                return
            except OSError as e:
                lost = e.strerror
                with contextlib.suppress(OSError):
                    os.ftruncate(self._log(), start)
        raise StateError(f"cannot write the state log {self.log_path}: {lost}")

    def delete(self, *names: str, sync: bool = True) -> None:
        """Record that these targets are gone; StateError and `sync` as for `put`."""
        self._append([{"del": name} for name in names], sync)

    def due_for_compaction(self, count: int) -> bool:
        """Whether the log has grown to the size of a snapshot of `count` targets."""
        return self._log_lines > max(COMPACT_MIN_LINES, count)

    def compact(self, targets: dict[str, Target]) -> None:
        """Write a snapshot of `targets` (the whole state) and empty the log; on failure
        the old snapshot and the log stay, which together still hold that state."""
        doc = {"version": STATE_VERSION, "targets": [asdict(t) for t in targets.values()]}
        data = json.dumps(doc, indent=1).encode()
        tmp = self.path.with_name(f".state.json.{os.getpid()}")
        try:
            _write_file(tmp, data)
            if _parse_snapshot(tmp.read_bytes()).keys() != targets.keys():
                raise StateError(f"{tmp} did not read back as written")
            if self.path.exists():
                prev = self.path.with_name("state.json.prev")
                with contextlib.suppress(FileNotFoundError):
                    prev.unlink()
                os.link(self.path, prev)
            os.replace(tmp, self.path)
            _fsync_dir(self.directory)
            self._truncate_log()
        except (OSError, StateError) as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            log.warning("cannot write a state snapshot (%s); the log keeps the state", e)

    def close(self) -> None:
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None

    def _append(self, changes: list[dict[str, Any]], sync: bool = True) -> None:
        data = b"".join(json.dumps(c).encode() + b"\n" for c in changes)
        try:
            fd = self._log()
            start = os.lseek(fd, 0, os.SEEK_END)
        except OSError as e:
            raise StateError(f"cannot write the state log {self.log_path}: "
                             f"{e.strerror}") from None
        try:
            _write_all(fd, data)
            if sync:
                os.fsync(fd)
        except OSError as e:
            cut = start
            if sync and self._unsynced_from is not None:  # a failed fsync may have lost them
                cut, self._unsynced_lost = self._unsynced_from, e.strerror
            with contextlib.suppress(OSError):
                os.ftruncate(fd, cut)  # no partial line is left behind
            raise StateError(f"cannot write the state log {self.log_path}: "
                             f"{e.strerror}") from None
        if not sync and self._unsynced_from is None:
            self._unsynced_from = start
        elif sync:
            self._unsynced_from = None
        self._log_lines += len(changes)

    def _log(self) -> int:
        if self._log_fd is None:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND
                                   | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        return self._log_fd

    def _truncate_log(self) -> None:
        fd = self._log()
        os.ftruncate(fd, 0)
        os.fsync(fd)
        self._log_lines = 0
        self._unsynced_from = self._unsynced_lost = None  # the snapshot holds them


def _parse_snapshot(raw: bytes) -> dict[str, Target]:
    doc = json.loads(raw)
    version = doc.get("version") if isinstance(doc, dict) else None
    if version not in READABLE_VERSIONS:
        raise ValueError(f"not a state file of version {READABLE_VERSIONS}")
    targets = {}
    for item in doc["targets"]:
        t = _target(item)
        targets[t.name] = t
    return targets


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(28, os.strerror(28))  # ENOSPC: a write that makes no progress
        view = view[n:]


def _write_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
