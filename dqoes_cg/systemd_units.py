"""Tell systemd the CPU limits and weights the daemon writes into the cgroups of systemd units.

systemd owns the cgroups of the units it starts (services, `systemd-run --scope` units,
Docker's docker-<id>.scope with the systemd cgroup driver): every `daemon-reload`,
`daemon-reexec` or `set-property` on a unit writes systemd's own value back into its
cpu.max and cpu.weight. So for a cgroup that is a unit, the daemon also sets the unit's
runtime properties CPUQuotaPerSecUSec and CPUQuotaPeriodUSec (and CPUWeight) through
systemd's D-Bus API (SetUnitProperties, as `systemctl set-property --runtime` does). The
direct write keeps the change immediate; this keeps it in force. systemd keeps the value it
was told to a percent of a CPU (its runtime drop-in reads CPUQuota=N%), so after a
daemon-reload the controller's reconcile finds a small drift, and writes and tells its own
value again.

A D-Bus call takes milliseconds and may block, so it never runs in the controller's tick:
`UnitLimiter.set_quota` and `set_weight` only record the latest request per unit and
property, and a background thread sends each unit's in one call. Without a system bus (a
machine without systemd, tests on fake trees) it logs once and drops requests until a bus
answers again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Protocol

import numpy as np
from jeepney import DBusAddress, Message, new_method_call
from jeepney.io.blocking import open_dbus_connection
from jeepney.wrappers import DBusErrorResponse, unwrap_msg

from .cgroup import systemd_unit
from .cgtable import LEAVE_ALONE

log = logging.getLogger(__name__)

SYSTEM_BUS = "unix:path=/run/dbus/system_bus_socket"
SYSTEMD_MANAGER = DBusAddress("/org/freedesktop/systemd1", bus_name="org.freedesktop.systemd1",
                              interface="org.freedesktop.systemd1.Manager")
USEC_INFINITY = 2**64 - 1  # systemd's "no limit"
USEC_PER_SEC = 1_000_000
CALL_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 5.0
NEVER_TOLD = -2  # a quota or weight no request has (-1 is "max")

Properties = dict[str, tuple[str, int]]
"""Unit properties to set, by name: (D-Bus signature, value)."""


class Connection(Protocol):
    def send_and_get_reply(self, message: Message, *, timeout: float | None = None
                           ) -> Message: ...

    def close(self) -> None: ...


def connect_system_bus() -> Connection:
    return open_dbus_connection(SYSTEM_BUS, auth_timeout=CALL_TIMEOUT_S)


def quota_properties(quota_usec: int, period_usec: int) -> Properties:
    """CPUQuotaPerSecUSec and CPUQuotaPeriodUSec for a cpu.max of `quota_usec` (< 0: "max")
    per `period_usec`."""
    per_sec = USEC_INFINITY if quota_usec < 0 else quota_usec * USEC_PER_SEC // period_usec
    return {"CPUQuotaPerSecUSec": ("t", per_sec), "CPUQuotaPeriodUSec": ("t", period_usec)}


def properties_message(unit: str, properties: Properties) -> Message:
    """SetUnitProperties(unit, runtime=true, properties)."""
    return new_method_call(SYSTEMD_MANAGER, "SetUnitProperties", "sba(sv)", (
        unit, True, list(properties.items())))


def quota_message(unit: str, quota_usec: int, period_usec: int) -> Message:
    """SetUnitProperties(unit, runtime=true, CPUQuotaPerSecUSec, CPUQuotaPeriodUSec) for a
    cpu.max of `quota_usec` (< 0: "max") per `period_usec`."""
    return properties_message(unit, quota_properties(quota_usec, period_usec))


class UnitLimiter:
    """Sends the latest CPU limit and weight of each unit to systemd from a thread of its
    own."""

    def __init__(self, connect: Callable[[], Connection] = connect_system_bus) -> None:
        self._connect = connect
        self._connection: Connection | None = None
        self._pending: dict[str, Properties] = {}
        self._busy = False  # a batch taken from _pending is being sent
        self._closing = False
        self._bus_missing_logged = False
        self._cond = threading.Condition()
        self.sent = 0
        self.failed = 0
        self._thread = threading.Thread(target=self._run, name="dqoes-systemd", daemon=True)
        self._thread.start()

    def set_quota(self, unit: str, quota_usec: int, period_usec: int) -> None:
        """Ask for `unit`'s limit to become cpu.max "quota period" (quota < 0: "max").
        Returns at once; a later request for the same unit replaces this one if unsent."""
        self._set(unit, quota_properties(quota_usec, period_usec))

    def set_weight(self, unit: str, weight: int) -> None:
        """Ask for `unit`'s CPUWeight to become `weight`, as `set_quota` does its limit (sent
        with it when both are pending)."""
        self._set(unit, {"CPUWeight": ("t", weight)})

    def _set(self, unit: str, properties: Properties) -> None:
        with self._cond:
            self._pending.setdefault(unit, {}).update(properties)
            self._cond.notify()

    def flush(self, timeout: float) -> bool:
        """Wait until every request so far was sent (or dropped); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Send what is pending (restored limits on shutdown), then stop the thread."""
        if not self.flush(timeout):
            log.warning("systemd did not take every unit limit within %.0f s", timeout)
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closing)
                if self._closing:
                    break
                batch, self._pending = self._pending, {}
                self._busy = True
            for unit, properties in batch.items():
                try:
                    self._send(unit, properties)
                except Exception:  # a bug must not stop every later update
                    self.failed += 1
                    log.exception("%s: telling systemd its CPU limit failed", unit)
            with self._cond:
                self._busy = False
                self._cond.notify_all()
        if self._connection is not None:
            self._connection.close()

    def _send(self, unit: str, properties: Properties) -> None:
        connection = self._connection or self._open()
        if connection is None:
            self.failed += 1
            return
        try:
            unwrap_msg(connection.send_and_get_reply(
                properties_message(unit, properties), timeout=CALL_TIMEOUT_S))
            self.sent += 1
            log.debug("%s: told systemd %s", unit,
                      ", ".join(f"{name}={value}" for name, (_, value) in properties.items()))
        except DBusErrorResponse as e:  # e.g. the unit is gone: nothing left to limit
            self.failed += 1
            log.info("%s: systemd refused the CPU limit: %s", unit, e)
        except (OSError, TimeoutError, ValueError) as e:
            self.failed += 1
            log.warning("%s: lost the system bus (%s); will reconnect", unit, e)
            connection.close()
            self._connection = None

    def _open(self) -> Connection | None:
        try:
            self._connection = self._connect()
        except (OSError, TimeoutError, ValueError) as e:
            if not self._bus_missing_logged:
                self._bus_missing_logged = True
                log.info("no system bus (%s): limits of systemd units are written to cpu.max "
                         "only, and systemd may put its own values back", e)
            return None
        if self._bus_missing_logged:
            log.info("connected to the system bus")
            self._bus_missing_logged = False
        return self._connection


class UnitQuotas:
    """Which slots of a fleet are systemd units, and the quota and weight systemd was last
    told for each. Built with every fleet (slot order), so a new fleet tells systemd once
    more."""

    def __init__(self, limiter: UnitLimiter | None, cgroups: Sequence[str | Path],
                 mount: Path) -> None:
        self.limiter = limiter
        self.units = [systemd_unit(PurePosixPath(c).relative_to(mount)) for c in cgroups] \
            if limiter else [None] * len(cgroups)
        self.is_unit = np.array([u is not None for u in self.units], bool)
        self.any = bool(self.is_unit.any())
        self.told_quota = np.full(len(cgroups), NEVER_TOLD, np.int64)
        self.told_weight = np.full(len(cgroups), NEVER_TOLD, np.int64)
        self._mask = np.zeros(len(cgroups), bool)
        self._requested = np.zeros(len(cgroups), bool)

    def tell(self, quota_usec: np.ndarray, period_usec: np.ndarray, weight: np.ndarray,
             again: np.ndarray | None = None) -> None:
        """Hand the limiter the requested cpu.max (quota < 0: max) and cpu.weight of every
        unit slot whose request (not LEAVE_ALONE) differs from what systemd was told, or
        that is flagged in `again`."""
        if not self.any:
            return
        assert self.limiter is not None
        for i in self._to_tell(quota_usec, self.told_quota, period_usec, again):
            self.limiter.set_quota(self._unit(i), int(quota_usec[i]), int(period_usec[i]))
            self.told_quota[i] = quota_usec[i]
        for i in self._to_tell(weight, self.told_weight, weight, again):
            self.limiter.set_weight(self._unit(i), int(weight[i]))
            self.told_weight[i] = weight[i]

    def _to_tell(self, value: np.ndarray, told: np.ndarray, request: np.ndarray,
                 again: np.ndarray | None) -> np.ndarray:
        """The unit slots whose `request` is not LEAVE_ALONE and whose `value` is not what
        systemd was `told` (or that are flagged in `again`): a few per decision."""
        mask = self._mask
        np.not_equal(value, told, out=mask)
        if again is not None:
            np.logical_or(mask, again, out=mask)
        np.logical_and(mask, self.is_unit, out=mask)
        np.not_equal(request, LEAVE_ALONE, out=self._requested)
        np.logical_and(mask, self._requested, out=mask)
        return np.flatnonzero(mask) if mask.any() else _NONE

    def _unit(self, slot: int) -> str:
        unit = self.units[slot]
        assert unit is not None
        return unit


_NONE = np.zeros(0, np.intp)
