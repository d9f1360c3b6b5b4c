"""The act step: every write of a container's CPU limit goes through the `Actuator`.

    apply(limits)     limits (fractions of the budget T_R; NaN: leave alone) become cpu.max
                      quotas, quota = max(1 ms, L·T_R·period) per period, and (with
                      --weights) cpu.weight in proportion, weight_of(L·T_R); both written
                      in one C call where they moved by more than DEAD_BAND (moved_into);
                      before the first write to a cgroup's file, its original value is saved
                      in the state (the journal), and a file whose original could not be
                      saved is not written
    reconcile(now)    every reconcile interval, one C call reads every cpu.max (and
                      cpu.weight) back; a value someone else changed is written again
    restore(mask)     the masked cgroups get the cpu.max and cpu.weight they had before our
                      first write

Why weights. A single-threaded container runs on one CPU at a time, and CFS spreads tasks
over the CPUs by their load, which is weighted by cpu.weight, not by cpu.max: with equal
weights, caps that add up to the CPUs are not all delivered (bench/results/packing.md: the
largest of five got 0.86-0.88 of its cap on 2 CPUs; 0.95-0.98 with weights in proportion to
the caps). A weight depends on its own container's limit alone (a cap of one CPU gets the
kernel's default, 100), so a weight changes only when its limit does, and a restarted
daemon finds its own weights where it left them.

A cgroup that is also a systemd unit is told the same limit and weight through systemd
(systemd_units), which would otherwise put its own values back on a daemon-reload.

Recommend-only (`acting` false): `apply` keeps the limits it would write in `limit` and
writes nothing, and `reconcile` only reads every cpu.max back (the values in force, for
status). `stop_acting` gives back what was written before; `restore` writes only where a
limit of ours is in force, so in a run that never acted no cpu.max is ever written.

Foreign writes. A value of someone else's is found by the reconcile, or by `apply` itself,
which reads a file before it writes over a value of ours. Each is counted per container
(`foreign_writes`, both files) and logged (at most once a minute per container and file).
Two controllers that keep rewriting one value make it flap and each other's decisions
meaningless, so the actuator does not fight: a container whose cpu.max (or cpu.weight) is
rewritten FIGHT_WRITES times within FIGHT_WINDOW_S is *contested* over that file: the file
is left to the other writer, and given neither our values nor, on unset or stop, our saved
original, for a back-off that starts at BACKOFF_S and doubles with every fight up to
BACKOFF_MAX_S; then the actuator writes it again. The other file stays ours (a controller
of weights, such as a kubelet, does not stop our limits). Contested containers show in
status, the log and the metrics.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from .cgtable import (
    LEAVE_ALONE,
    PERIOD_UNKNOWN,
    WEIGHT_MAX,
    WEIGHT_MIN,
    WEIGHT_UNKNOWN,
    CgroupTable,
    Status,
)
from .fleet import carry_index
from .policy.base import T_R
from .state import Originals, StateError
from .systemd_units import UnitLimiter, UnitQuotas

log = logging.getLogger(__name__)

MIN_QUOTA_USEC = 1_000
# A limit within this fraction of the one in force is not written: on a real kernel every
# cpu.max write walks every task group (bench/hierarchy.py: 5.9 us with 100 cgroups, 311 us
# with 10,000), and a container's measurements move its computed limit by a percent or two
# from window to window without a change of need. Chosen by its effect on |S|: see
# bench/experiments, "The dead band".
DEAD_BAND = 0.02
WEIGHT_PER_CPU = 100  # the kernel's default cpu.weight, given to a cap of one CPU
FIGHT_WRITES = 3
FIGHT_WINDOW_S = 60.0
BACKOFF_S = 60.0
BACKOFF_MAX_S = 960.0
LOG_EVERY_S = 60.0
OK = int(Status.OK)  # numpy compares an array with a plain int faster than with an IntEnum


class Journal(Protocol):
    """Where the original limits are kept (the daemon's state)."""

    def record_originals(self, originals: dict[str, Originals]) -> None:
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


def weight_of(cpus: float) -> int:
    """The cpu.weight of a container capped at `cpus` CPUs (what `apply` writes)."""
    return int(np.clip(round(cpus * WEIGHT_PER_CPU), WEIGHT_MIN, WEIGHT_MAX))


class Fights:
    """Foreign writes to one file (cpu.max or cpu.weight) of every slot, and the slots left
    to the other writer after a fight over it (see the module's docstring)."""

    def __init__(self, file: str, names: list[str]) -> None:
        n = len(names)
        self.file, self.names = file, names
        self.foreign_writes = np.zeros(n, np.uint64)
        self._foreign_at = np.full((n, FIGHT_WRITES), -math.inf)  # the last few, oldest first
        self.contested_until = np.zeros(n)  # monotonic; 0: not contested
        self._backoff = np.full(n, BACKOFF_S)
        self._logged_at = np.full(n, -math.inf)

    def carry_over(self, previous: Fights, new: np.ndarray, old: np.ndarray) -> None:
        """Take over slots `old` of `previous` (the table before a membership change) as
        slots `new`."""
        for attr in ("foreign_writes", "_foreign_at", "contested_until", "_backoff",
                     "_logged_at"):
            getattr(self, attr)[new] = getattr(previous, attr)[old]

    @property
    def contested(self) -> np.ndarray:
        return self.contested_until > 0

    def any_contested(self) -> bool:
        return bool(self.contested_until.any())

    def count(self, found: np.ndarray, now: float, when: str,
              values: Callable[[int], tuple[str, str]]) -> list[int]:
        """Count the foreign writes flagged in `found`; returns the slots that this makes
        contested. `values(slot)`: the value found and ours, for the log."""
        newly = []
        for i in np.flatnonzero(found):  # rare: someone else wrote a value of ours
            self.foreign_writes[i] += 1
            times = self._foreign_at[i]
            times[:-1] = times[1:]
            times[-1] = now
            name = self.names[i]
            if now - times[0] <= FIGHT_WINDOW_S:
                self.contested_until[i] = now + self._backoff[i]
                log.warning("%s: %s rewritten by someone else %d times within %.0f s; "
                            "leaving it to them for %.0f s", name, self.file, FIGHT_WRITES,
                            FIGHT_WINDOW_S, self._backoff[i])
                self._backoff[i] = min(2 * self._backoff[i], BACKOFF_MAX_S)
                times.fill(-math.inf)
                newly.append(int(i))
            elif now - self._logged_at[i] >= LOG_EVERY_S:
                self._logged_at[i] = now
                theirs, ours = values(int(i))
                log.warning("%s: %s was changed to '%s' by someone else %s; writing '%s' "
                            "again", name, self.file, theirs, when, ours)
        return newly

    def resume_expired(self, now: float) -> None:
        if not self.any_contested():
            return
        expired = (self.contested_until > 0) & (self.contested_until <= now)
        for i in np.flatnonzero(expired):
            log.info("%s: back-off over; writing its %s again", self.names[i], self.file)
        self.contested_until[expired] = 0.0


class Actuator:
    """Writes, reconciles and restores the cpu.max and cpu.weight of a fixed list of cgroups
    (the slots of `table`, named by `names`), built anew on each membership change."""

    def __init__(self, table: CgroupTable, names: Sequence[str],
                 originals: Sequence[Originals], cpus: float, journal: Journal, *,
                 weights: bool, period_usec: int, reconcile_interval: float,
                 limiter: UnitLimiter | None, mount: Path,
                 previous: Actuator | None = None, acting: bool = True) -> None:
        """`originals`: what the state saved of each cgroup; `weights`: whether to write
        cpu.weight (dqoesd --weights; False: weights written by an earlier run are still given
        back on unset and stop); `acting`: False to recommend only (write nothing)."""
        n = len(names)
        self.acting = acting
        self.table = table
        self.names = list(names)
        self.cpus = cpus
        self.weights = weights
        self.period_usec = period_usec
        self.reconcile_interval = reconcile_interval
        self._journal = journal
        self.units = UnitQuotas(limiter, table.dirs, mount)
        parsed = [parse_cpu_max(o.cpu_max) if o.cpu_max else (-1, PERIOD_UNKNOWN)
                  for o in originals]
        self.original_quota = np.array([q for q, _ in parsed], np.int64)
        self.original_period = np.array([p for _, p in parsed], np.int64)
        self.original_weight = np.array([o.weight or WEIGHT_UNKNOWN for o in originals],
                                        np.int64)
        # In force (recommending: what would be), fraction of T_R; NaN: not ours
        self.limit = np.full(n, np.nan)
        self.max_fights = Fights("cpu.max", self.names)
        self.weight_fights = Fights("cpu.weight", self.names)
        self.corrections = 0 if previous is None else previous.corrections
        self._next_reconcile = 0.0
        self._quota = np.zeros(n)  # scratch
        self._weight = np.zeros(n)
        self._mask = np.zeros(n, bool)
        self._weight_mask = np.zeros(n, bool)
        self._first = np.zeros(n, bool)
        self._first_weight = np.zeros(n, bool)
        self._unsaved = np.zeros(n, bool)
        self._moved = np.zeros(n, bool)
        self._delta = np.zeros(n)

        if previous is not None:
            self._carry_over(previous)
        known_weight = self.original_weight != WEIGHT_UNKNOWN
        table.read_back(weights=weights or bool(known_weight.any()))
        # Re-adopted after a restart (our original is saved, the table is new): the value in
        # force is the one we wrote, and goes on from there.
        adopted = (self.original_period != PERIOD_UNKNOWN) & np.isnan(self.limit)
        adopted &= (table.last_period_usec == PERIOD_UNKNOWN) & (table.max_quota_usec >= 0)
        adopted &= table.read_back_status == Status.OK
        if adopted.any():
            self.limit[adopted] = (table.max_quota_usec[adopted]
                                   / table.max_period_usec[adopted] / cpus)
            table.last_quota_usec[adopted] = table.max_quota_usec[adopted]
            table.last_period_usec[adopted] = table.max_period_usec[adopted]
        adopted = known_weight & (table.last_weight == WEIGHT_UNKNOWN)
        adopted &= (table.weight_read_back_status == Status.OK) & ~self.weight_fights.contested
        table.last_weight[adopted] = table.found_weight[adopted]

    def _carry_over(self, previous: Actuator) -> None:
        new, old = carry_index(self.names, previous.names)
        self.limit[new] = previous.limit[old]
        self.max_fights.carry_over(previous.max_fights, new, old)
        self.weight_fights.carry_over(previous.weight_fights, new, old)

    def __len__(self) -> int:
        return len(self.names)

    @property
    def contested(self) -> np.ndarray:
        """The containers whose cpu.max or cpu.weight is left to another writer."""
        return self.max_fights.contested | self.weight_fights.contested

    @property
    def foreign_writes(self) -> np.ndarray:
        """Per container, the values of someone else's found in place of ours (both files)."""
        return self.max_fights.foreign_writes + self.weight_fights.foreign_writes

    # --- apply -------------------------------------------------------------------------

    def apply(self, limits: np.ndarray, now: float) -> None:
        """Write `limits` (fractions of T_R; NaN: leave alone), and their weights, where they
        moved by more than DEAD_BAND; recommending, only keep them as the limits it would
        write."""
        self._resume_expired(now)
        moved_into(self._moved, limits, self.limit, DEAD_BAND, self._delta, self._unsaved)
        # What is to be in force: the new limit where it moved, else the one in force (the
        # table writes only what differs from its last write: a weight not yet ours, say).
        wanted = self._delta
        np.copyto(wanted, self.limit)
        np.putmask(wanted, self._moved, limits)
        mask = self._request(wanted, None)
        if not self.acting:
            np.putmask(self.limit, mask, wanted)
            return
        if not self._journal_first_writes():
            return
        self._write(now)
        np.equal(self.table.apply_status, OK, out=self._first)
        np.logical_and(mask, self._first, out=mask)
        np.putmask(self.limit, mask, wanted)

    def _request(self, limits: np.ndarray, only: np.ndarray | None) -> np.ndarray:
        """Fill the table's request with the quotas (and weights) of `limits` where they are
        finite (and in `only`) and that file of the container is not contested; the rest is
        left alone. Returns the mask of the slots whose cpu.max is requested (valid until
        the next call)."""
        t, q, mask = self.table, self._quota, self._mask
        np.multiply(limits, self.cpus * self.period_usec, out=q)
        np.rint(q, out=q)
        np.maximum(q, MIN_QUOTA_USEC, out=q)  # NaN stays NaN
        np.isfinite(q, out=mask)
        if only is not None:
            np.logical_and(mask, only, out=mask)
        t.weight.fill(LEAVE_ALONE)
        if self.weights:
            w, weighted = self._weight, self._weight_mask
            np.multiply(limits, self.cpus * WEIGHT_PER_CPU, out=w)
            np.rint(w, out=w)
            np.clip(w, WEIGHT_MIN, WEIGHT_MAX, out=w)  # NaN stays NaN, and is not requested
            np.copyto(weighted, mask)
            if self.weight_fights.any_contested():
                np.logical_and(weighted, ~self.weight_fights.contested, out=weighted)
            np.copyto(t.weight, w, where=weighted, casting="unsafe")
        if self.max_fights.any_contested():
            np.logical_and(mask, ~self.max_fights.contested, out=mask)
        t.period_usec.fill(LEAVE_ALONE)
        np.copyto(t.quota_usec, q, where=mask, casting="unsafe")
        np.putmask(t.period_usec, mask, self.period_usec)
        return mask

    def _journal_first_writes(self) -> bool:
        """Save the original cpu.max and cpu.weight of every cgroup about to be written for
        the first time; where that fails (or the original cannot be read), those are not
        written. False: nothing left to write."""
        t = self.table
        first, first_weight = self._first, self._first_weight
        np.not_equal(t.period_usec, LEAVE_ALONE, out=first)
        np.equal(self.original_period, PERIOD_UNKNOWN, out=self._unsaved)
        np.logical_and(first, self._unsaved, out=first)
        np.not_equal(t.weight, LEAVE_ALONE, out=first_weight)
        np.equal(self.original_weight, WEIGHT_UNKNOWN, out=self._unsaved)
        np.logical_and(first_weight, self._unsaved, out=first_weight)
        if not first.any() and not first_weight.any():  # the usual case: every original known
            return True
        t.read_back(weights=bool(first_weight.any()))  # the values in force now
        readable_max = first & (t.read_back_status == Status.OK)
        readable_weight = first_weight & (t.weight_read_back_status == Status.OK)
        slots = np.flatnonzero(readable_max | readable_weight)
        originals = {self.names[i]: Originals(
            format_cpu_max(int(t.max_quota_usec[i]), int(t.max_period_usec[i]))
            if readable_max[i] else None,
            int(t.found_weight[i]) if readable_weight[i] else None) for i in slots}
        try:
            self._journal.record_originals(originals)
        except StateError as e:
            log.error("not limiting %d container(s): their original cpu.max or cpu.weight "
                      "could not be saved (%s)", len(slots), e)
            readable_max[:] = readable_weight[:] = False
        self.original_quota[readable_max] = t.max_quota_usec[readable_max]
        self.original_period[readable_max] = t.max_period_usec[readable_max]
        self.original_weight[readable_weight] = t.found_weight[readable_weight]
        t.period_usec[first & ~readable_max] = LEAVE_ALONE  # their original is not saved
        t.weight[first_weight & ~readable_weight] = LEAVE_ALONE
        return bool((t.period_usec != LEAVE_ALONE).any() or (t.weight != LEAVE_ALONE).any())

    def _write(self, now: float, again: np.ndarray | None = None) -> None:
        t = self.table
        t.foreign.fill(False)
        t.weight_foreign.fill(False)
        t.apply()
        self._foreign(t.foreign, t.weight_foreign, now, "before our next write")
        self.units.tell(t.quota_usec, t.period_usec, t.weight, again=again)

    # --- reconcile -----------------------------------------------------------------------

    def reconcile(self, now: float) -> None:
        """Every reconcile interval: read every cpu.max (and cpu.weight) back and write ours
        again where someone else changed it (unless the container is contested over it)."""
        if now < self._next_reconcile or not len(self):
            return
        self._next_reconcile = now + self.reconcile_interval
        t = self.table
        self._resume_expired(now)
        if not t.read_back(weights=self.weights) or not self.acting:
            return
        # may contest some
        self._foreign(t.drifted, t.weight_drifted, now, "in the last reconcile interval")
        drifted = t.drifted & ~self.max_fights.contested
        weight_drifted = t.weight_drifted & ~self.weight_fights.contested
        self.corrections += int(np.count_nonzero(drifted) + np.count_nonzero(weight_drifted))
        t.invalidate(drifted)
        t.invalidate_weight(weight_drifted)
        mask = self._request(self.limit, drifted | weight_drifted)
        # systemd may have put its own value back (daemon-reload): tell it ours again.
        self._write(now, again=mask | self._weight_mask)

    # --- mode ----------------------------------------------------------------------------

    def start_acting(self) -> None:
        """Write the limits decided from now on: none recommended is in force, so the next
        `apply` writes every one (the dead band compares with what is in force)."""
        self.acting = True
        self.limit.fill(np.nan)

    def stop_acting(self) -> None:
        """Recommend only from now on: every cpu.max and cpu.weight written before is given
        back."""
        self.acting = False
        t = self.table
        self.restore((t.last_period_usec != PERIOD_UNKNOWN) | (t.last_weight != WEIGHT_UNKNOWN))

    # --- restore -------------------------------------------------------------------------

    def restore(self, mask: np.ndarray) -> list[str | None]:
        """Give the masked cgroups the cpu.max and cpu.weight they had before our first write
        (unless left to another writer), and forget those originals. Returns each masked
        cgroup's cpu.max given back (None: never written, or left to another writer)."""
        t = self.table
        known = mask & (self.original_period != PERIOD_UNKNOWN)
        owned = known & (t.last_period_usec != PERIOD_UNKNOWN) & ~self.max_fights.contested
        known_weight = mask & (self.original_weight != WEIGHT_UNKNOWN)
        owned_weight = known_weight & (t.last_weight != WEIGHT_UNKNOWN)
        owned_weight &= ~self.weight_fights.contested
        t.period_usec.fill(LEAVE_ALONE)
        t.weight.fill(LEAVE_ALONE)
        np.putmask(t.quota_usec, owned, self.original_quota)
        np.putmask(t.period_usec, owned, self.original_period)
        np.putmask(t.weight, owned_weight, self.original_weight)
        t.apply()
        self.units.tell(t.quota_usec, t.period_usec, t.weight)
        for i in np.flatnonzero(owned & (t.apply_status != Status.OK)):
            log.warning("%s: could not restore cpu.max (%s)", self.names[i], t.error(int(i)))
        for i in np.flatnonzero(owned_weight & (t.weight_apply_status != Status.OK)):
            log.warning("%s: could not restore cpu.weight (%s)", self.names[i],
                        t.error(int(i), weight=True))
        for fights, known_file in ((self.max_fights, known),
                                   (self.weight_fights, known_weight)):
            for i in np.flatnonzero(known_file & fights.contested):
                log.warning("%s: %s left to the other writer, not restored", self.names[i],
                            fights.file)
        restored = [format_cpu_max(int(self.original_quota[i]), int(self.original_period[i]))
                    if owned[i] else None for i in np.flatnonzero(mask)]
        forgotten = [self.names[i] for i in np.flatnonzero(known | known_weight)]
        if forgotten:
            try:
                self._journal.forget_originals(forgotten)
            except StateError as e:  # given back all the same; the next start re-adopts
                log.warning("could not record that originals were restored: %s", e)
        self.original_period[known] = PERIOD_UNKNOWN
        self.original_weight[known_weight] = WEIGHT_UNKNOWN
        self.limit[mask] = np.nan
        t.invalidate(mask)
        t.invalidate_weight(mask)
        return restored

    # --- fights --------------------------------------------------------------------------

    def _foreign(self, max_foreign: np.ndarray, weight_foreign: np.ndarray, now: float,
                 when: str) -> None:
        """Count the foreign writes flagged in `max_foreign` and `weight_foreign`; stop
        tracking a file of a container that fights over it (no drift is counted while it
        lasts)."""
        t = self.table
        if max_foreign.any():
            for i in self.max_fights.count(max_foreign, now, when, lambda i: (
                    format_cpu_max(int(t.max_quota_usec[i]), int(t.max_period_usec[i])),
                    format_cpu_max(int(t.last_quota_usec[i]), int(t.last_period_usec[i])))):
                self.limit[i] = np.nan
                t.last_period_usec[i] = PERIOD_UNKNOWN
        if weight_foreign.any():
            for i in self.weight_fights.count(weight_foreign, now, when, lambda i: (
                    str(t.found_weight[i]), str(t.last_weight[i]))):
                t.last_weight[i] = WEIGHT_UNKNOWN

    def _resume_expired(self, now: float) -> None:
        self.max_fights.resume_expired(now)
        self.weight_fights.resume_expired(now)
