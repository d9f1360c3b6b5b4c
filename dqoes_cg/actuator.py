"""The act step: every write of a container's CPU limit goes through the `Actuator`.

    apply(limits)     limits (fractions of the budget T_R; NaN: leave alone) become cpu.max
                      quotas, quota = max(1 ms, L·T_R·period) per period, written in one C
                      call where they moved by more than DEAD_BAND (moved_into); before
                      the first write to a cgroup its
                      cpu.max is saved in the state (the journal), and a cgroup whose
                      original could not be saved is not written
    reconcile(now)    every reconcile interval, one C call reads every cpu.max back; a limit
                      someone else changed is written again
    restore(mask)     the masked cgroups get the cpu.max they had before our first write

A cgroup that is also a systemd unit is told the same limit through systemd
(systemd_units), which would otherwise put its own value back on a daemon-reload.

Recommend-only (`acting` false): `apply` keeps the limits it would write in `limit` and
writes nothing, and `reconcile` only reads every cpu.max back (the values in force, for
status). `stop_acting` gives back what was written before; `restore` writes only where a
limit of ours is in force, so in a run that never acted no cpu.max is ever written.

Foreign writes. A value of someone else's is found by the reconcile, or by `apply` itself,
which reads cpu.max before it writes over a value of ours. Each is counted per container
(`foreign_writes`) and logged (at most once a minute per container). Two controllers that
keep rewriting one limit make it flap and each other's decisions meaningless, so the
actuator does not fight: a container whose limit is rewritten FIGHT_WRITES times within
FIGHT_WINDOW_S is *contested*: its cpu.max is left to the other writer, and given neither
our limits nor, on unset or stop, our saved original, for a back-off that starts at
BACKOFF_S and doubles with every fight up to BACKOFF_MAX_S; then the actuator writes its
limit again. Contested containers show in status, the log and the metrics.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from .cgtable import LEAVE_ALONE, PERIOD_UNKNOWN, CgroupTable, Status
from .fleet import carry_index
from .policy.base import T_R
from .state import StateError
from .systemd_units import UnitLimiter, UnitQuotas

log = logging.getLogger(__name__)

MIN_QUOTA_USEC = 1_000
# A limit within this fraction of the one in force is not written: on a real kernel every
# cpu.max write walks every task group (bench/hierarchy.py: 5.9 us with 100 cgroups, 311 us
# with 10,000), and a container's measurements move its computed limit by a percent or two
# from window to window without a change of need. Chosen by its effect on |S|: see
# bench/experiments, "The dead band".
DEAD_BAND = 0.02
FIGHT_WRITES = 3
FIGHT_WINDOW_S = 60.0
BACKOFF_S = 60.0
BACKOFF_MAX_S = 960.0
LOG_EVERY_S = 60.0
OK = int(Status.OK)  # numpy compares an array with a plain int faster than with an IntEnum


class Journal(Protocol):
    """Where the original limits are kept (the daemon's state)."""

    def record_originals(self, originals: dict[str, str]) -> None:
        """Persist these originals; StateError if they could not be."""

    def forget_originals(self, names: list[str]) -> None:
        """These originals were given back (or are no longer ours to give)."""


def parse_cpu_max(text: str) -> tuple[int, int]:
    """'50000 100000' -> (50000, 100000); 'max 100000' -> (-1, 100000)."""
    quota, period = text.split()
    return (-1 if quota == "max" else int(quota)), int(period)


def format_cpu_max(quota: int, period: int) -> str:
    return f"{'max' if quota < 0 else quota} {period}"


def moved_into(out: np.ndarray, limits: np.ndarray, in_force: np.ndarray, band: float,
               delta: np.ndarray, scratch: np.ndarray) -> None:
    """out: the finite `limits` worth writing over `in_force` (NaN: none of ours): new ones,
    and those that moved by more than `band` of the limit in force. If leaving the others
    in force would take the sum of caps past the budget T_R, every decrease is written too:
    caps that add up to at most the budget are guarantees. Allocates nothing."""
    np.subtract(limits, in_force, out=delta)
    np.abs(delta, out=delta)
    np.divide(delta, in_force, out=delta)
    np.greater(delta, band, out=out)  # NaN (none in force, or no limit) compares false
    np.logical_or(out, np.isnan(in_force, out=scratch), out=out)
    np.logical_and(out, np.isfinite(limits, out=scratch), out=out)
    np.copyto(delta, in_force)
    np.putmask(delta, out, limits)
    np.nan_to_num(delta, copy=False)
    if float(delta.sum()) > T_R * (1.0 + 1e-9):
        np.less(limits, in_force, out=scratch)
        np.logical_or(out, scratch, out=out)


class Actuator:
    """Writes, reconciles and restores the cpu.max of a fixed list of cgroups (the slots of
    `table`, named by `names`), built anew on each membership change."""

    def __init__(self, table: CgroupTable, names: Sequence[str], originals: Sequence[str | None],
                 cpus: float, journal: Journal, *, period_usec: int,
                 reconcile_interval: float, limiter: UnitLimiter | None, mount: Path,
                 previous: Actuator | None = None, acting: bool = True) -> None:
        n = len(names)
        self.acting = acting
        self.table = table
        self.names = list(names)
        self.cpus = cpus
        self.period_usec = period_usec
        self.reconcile_interval = reconcile_interval
        self._journal = journal
        self.units = UnitQuotas(limiter, table.dirs, mount)
        parsed = [parse_cpu_max(o) if o else (-1, PERIOD_UNKNOWN) for o in originals]
        self.original_quota = np.array([q for q, _ in parsed], np.int64)
        self.original_period = np.array([p for _, p in parsed], np.int64)
        # In force (recommending: what would be), fraction of T_R; NaN: not ours
        self.limit = np.full(n, np.nan)
        self.foreign_writes = np.zeros(n, np.uint64)
        self.corrections = 0 if previous is None else previous.corrections
        self._foreign_at = np.full((n, FIGHT_WRITES), -math.inf)  # the last few, oldest first
        self._contested_until = np.zeros(n)  # monotonic; 0: not contested
        self._backoff = np.full(n, BACKOFF_S)
        self._logged_at = np.full(n, -math.inf)
        self._next_reconcile = 0.0
        self._quota = np.zeros(n)  # scratch
        self._mask = np.zeros(n, bool)
        self._first = np.zeros(n, bool)
        self._unsaved = np.zeros(n, bool)
        self._moved = np.zeros(n, bool)
        self._delta = np.zeros(n)

        table.read_back()
        if previous is not None:
            self._carry_over(previous)
        # Re-adopted after a restart (our original is saved, the table is new): the limit in
        # force is the one we wrote, and goes on from there.
        adopted = (self.original_period != PERIOD_UNKNOWN) & np.isnan(self.limit)
        adopted &= (table.last_period_usec == PERIOD_UNKNOWN) & (table.max_quota_usec >= 0)
        adopted &= table.read_back_status == Status.OK
        if adopted.any():
            self.limit[adopted] = (table.max_quota_usec[adopted]
                                   / table.max_period_usec[adopted] / cpus)
            table.last_quota_usec[adopted] = table.max_quota_usec[adopted]
            table.last_period_usec[adopted] = table.max_period_usec[adopted]

    def _carry_over(self, previous: Actuator) -> None:
        new, old = carry_index(self.names, previous.names)
        for attr in ("limit", "foreign_writes", "_foreign_at", "_contested_until",
                     "_backoff", "_logged_at"):
            getattr(self, attr)[new] = getattr(previous, attr)[old]

    def __len__(self) -> int:
        return len(self.names)

    @property
    def contested(self) -> np.ndarray:
        return self._contested_until > 0

    # --- apply -------------------------------------------------------------------------

    def apply(self, limits: np.ndarray, now: float) -> None:
        """Write `limits` (fractions of T_R; NaN: leave alone) where they moved by more
        than DEAD_BAND; recommending, only keep them as the limits it would write."""
        self._resume_expired(now)
        moved_into(self._moved, limits, self.limit, DEAD_BAND, self._delta, self._unsaved)
        mask = self._request(limits, self._moved)
        if not self.acting:
            np.putmask(self.limit, mask, limits)
            return
        if not self._journal_first_writes():
            return
        self._write(now)
        np.equal(self.table.apply_status, OK, out=self._first)
        np.logical_and(mask, self._first, out=mask)
        np.putmask(self.limit, mask, limits)

    def _request(self, limits: np.ndarray, only: np.ndarray | None) -> np.ndarray:
        """Fill the table's request with the quotas of `limits` where they are finite (and
        in `only`), the container is not contested; the rest is left alone. Returns the
        mask of the slots requested (valid until the next call)."""
        t, q, mask = self.table, self._quota, self._mask
        np.multiply(limits, self.cpus * self.period_usec, out=q)
        np.rint(q, out=q)
        np.maximum(q, MIN_QUOTA_USEC, out=q)  # NaN stays NaN
        np.isfinite(q, out=mask)
        if only is not None:
            np.logical_and(mask, only, out=mask)
        if self._any_contested():
            np.logical_and(mask, ~self.contested, out=mask)
        t.period_usec.fill(LEAVE_ALONE)
        np.copyto(t.quota_usec, q, where=mask, casting="unsafe")
        np.putmask(t.period_usec, mask, self.period_usec)
        return mask

    def _journal_first_writes(self) -> bool:
        """Save the original cpu.max of every cgroup about to be written for the first
        time; where that fails, those are not written. False: nothing left to write."""
        t = self.table
        first = self._first
        np.not_equal(t.period_usec, LEAVE_ALONE, out=first)
        np.equal(self.original_period, PERIOD_UNKNOWN, out=self._unsaved)
        np.logical_and(first, self._unsaved, out=first)
        if not first.any():  # the usual case: every original is known
            return True
        t.read_back()  # the values in force now
        first &= t.read_back_status == Status.OK
        slots = np.flatnonzero(first)
        originals = {self.names[i]: format_cpu_max(int(t.max_quota_usec[i]),
                                                   int(t.max_period_usec[i])) for i in slots}
        try:
            self._journal.record_originals(originals)
        except StateError as e:
            log.error("not limiting %d container(s): their original cpu.max could not be "
                      "saved (%s)", len(slots), e)
            t.period_usec[slots] = LEAVE_ALONE
            return bool((t.period_usec != LEAVE_ALONE).any())
        self.original_quota[slots] = t.max_quota_usec[slots]
        self.original_period[slots] = t.max_period_usec[slots]
        return True

    def _write(self, now: float, again: np.ndarray | None = None) -> None:
        t = self.table
        t.foreign.fill(False)
        t.apply()
        if t.foreign.any():
            self._foreign(t.foreign, now, "before our next write")
        self.units.tell(t.quota_usec, t.period_usec, again=again)

    # --- reconcile -----------------------------------------------------------------------

    def reconcile(self, now: float) -> None:
        """Every reconcile interval: read every cpu.max back and write ours again where
        someone else changed it (unless the container is contested)."""
        if now < self._next_reconcile or not len(self):
            return
        self._next_reconcile = now + self.reconcile_interval
        t = self.table
        self._resume_expired(now)
        if not t.read_back() or not self.acting:
            return
        drifted = t.drifted
        if not drifted.any():
            return
        self._foreign(drifted, now, "in the last reconcile interval")  # may contest some
        drifted = drifted & ~self.contested
        self.corrections += int(np.count_nonzero(drifted))
        t.invalidate(drifted)
        mask = self._request(self.limit, drifted)
        # systemd may have put its own value back (daemon-reload): tell it ours again.
        self._write(now, again=mask)

    # --- mode ----------------------------------------------------------------------------

    def start_acting(self) -> None:
        """Write the limits decided from now on: none recommended is in force, so the next
        `apply` writes every one (the dead band compares with what is in force)."""
        self.acting = True
        self.limit.fill(np.nan)

    def stop_acting(self) -> None:
        """Recommend only from now on: every cpu.max written before is given back."""
        self.acting = False
        self.restore(self.table.last_period_usec != PERIOD_UNKNOWN)

    # --- restore -------------------------------------------------------------------------

    def restore(self, mask: np.ndarray) -> list[str | None]:
        """Give the masked cgroups the cpu.max they had before our first write (None for
        those we never wrote, or left to another writer), and forget those originals."""
        t = self.table
        known = mask & (self.original_period != PERIOD_UNKNOWN)
        owned = known & (t.last_period_usec != PERIOD_UNKNOWN) & ~self.contested
        t.period_usec.fill(LEAVE_ALONE)
        np.putmask(t.quota_usec, owned, self.original_quota)
        np.putmask(t.period_usec, owned, self.original_period)
        t.apply()
        self.units.tell(t.quota_usec, t.period_usec)
        for i in np.flatnonzero(owned & (t.apply_status != Status.OK)):
            log.warning("%s: could not restore cpu.max (%s)", self.names[i], t.error(int(i)))
        for i in np.flatnonzero(known & self.contested):
            log.warning("%s: cpu.max left to the other writer, not restored", self.names[i])
        restored = [format_cpu_max(int(self.original_quota[i]), int(self.original_period[i]))
                    if owned[i] else None for i in np.flatnonzero(mask)]
        forgotten = [self.names[i] for i in np.flatnonzero(known)]
        if forgotten:
            try:
                self._journal.forget_originals(forgotten)
            except StateError as e:  # given back all the same; the next start re-adopts
                log.warning("could not record that originals were restored: %s", e)
        self.original_period[known] = PERIOD_UNKNOWN
        self.limit[mask] = np.nan
        t.invalidate(mask)
        return restored

    # --- fights --------------------------------------------------------------------------

    def _foreign(self, found: np.ndarray, now: float, when: str) -> None:
        """Count the foreign writes flagged in `found`; contest a container that fights."""
        if not found.any():
            return
        t = self.table
        for i in np.flatnonzero(found):  # rare: someone else wrote a limit of ours
            self.foreign_writes[i] += 1
            times = self._foreign_at[i]
            times[:-1] = times[1:]
            times[-1] = now
            name = self.names[i]
            if now - times[0] <= FIGHT_WINDOW_S:
                # Contested: stop tracking the slot (no drift is counted while it lasts).
                self._contested_until[i] = now + self._backoff[i]
                log.warning("%s: cpu.max rewritten by someone else %d times within %.0f s; "
                            "leaving it to them for %.0f s", name, FIGHT_WRITES,
                            FIGHT_WINDOW_S, self._backoff[i])
                self._backoff[i] = min(2 * self._backoff[i], BACKOFF_MAX_S)
                times.fill(-math.inf)
                self.limit[i] = np.nan
                t.last_period_usec[i] = PERIOD_UNKNOWN
            elif now - self._logged_at[i] >= LOG_EVERY_S:
                found_text = format_cpu_max(int(t.max_quota_usec[i]),
                                            int(t.max_period_usec[i]))
                self._logged_at[i] = now
                log.warning("%s: cpu.max was changed to '%s' by someone else %s; writing "
                            "'%s' again", name, found_text, when,
                            format_cpu_max(int(t.last_quota_usec[i]),
                                           int(t.last_period_usec[i])))

    def _any_contested(self) -> bool:
        return bool(self._contested_until.any())

    def _resume_expired(self, now: float) -> None:
        if not self._any_contested():
            return
        expired = (self._contested_until > 0) & (self._contested_until <= now)
        for i in np.flatnonzero(expired):
            log.info("%s: back-off over; limiting it again", self.names[i])
        self._contested_until[expired] = 0.0
