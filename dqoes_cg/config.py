"""The daemon's configuration (dqoesd's options)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .cgtable import DEFAULT_PERIOD_USEC
from .paths import RUN_DIR, SOCKET_NAME, STATE_DIR
from .policy import DEFAULT_POLICY, PolicyParams
from .ring import DEFAULT_CAPACITY


@dataclass
class Config:
    sample_interval: float = 1.0  # seconds between ticks
    state_dir: Path = STATE_DIR
    run_dir: Path = RUN_DIR
    cpus: float | None = None  # the budget T_R in CPUs; None: all online CPUs
    policy: str = DEFAULT_POLICY
    params: PolicyParams = field(default_factory=PolicyParams)
    period_usec: int = DEFAULT_PERIOD_USEC  # the cpu.max period of the limits written
    weights: bool = False  # cpu.weight in proportion to each limit (dqoesd --weights)
    ring_capacity: int = DEFAULT_CAPACITY
    rebind_interval: float = 2.0  # seconds between looks for pending containers
    # Seconds between read-backs of every cpu.max. Outside writers are rare (an operator, a
    # systemd daemon-reload), and a write of ours checks the value it replaces anyway: a
    # read-back every tick would cost more than the rest of the sense step at 1,000.
    reconcile_interval: float = 2.0
    mount: Path | None = None  # the cgroup2 mount; None: found in /proc/self/mountinfo
    recommend: bool = False  # at start: decide, show the limits it would set, write none

    @property
    def socket(self) -> Path:
        return self.run_dir / SOCKET_NAME
