"""The latency ring of each target: its volume's (`Target.ring`, the volume driver's,
volumes.py), or its own, `<run_dir>/rings/<name>/ring`, which the daemon creates with the
target and removes with it. The producers and the format: ring.py, docs/ring-format.md.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from ..ring import create_ring, ring_dir_name, ring_path
from .objective import Target
from .targets import TargetError, Targets


class Rings:
    """The ring paths of `targets`; an own ring's path is kept while its name is a target
    (computing it costs a rebuild and a status most of their time otherwise)."""

    def __init__(self, run_dir: Path, capacity: int, targets: Targets) -> None:
        self.run_dir = run_dir
        self.capacity = capacity
        self.targets = targets
        self._own: dict[str, Path] = {}

    def __len__(self) -> int:
        """How many own ring paths are kept."""
        return len(self._own)

    def path(self, name: str) -> Path:
        """The ring of `name`: its target's volume's, or its own (also for a name that is
        no target: where its ring would be)."""
        target = self.targets.find(name)
        path = _ring_of(self.run_dir, self._own, name, target)
        if target is not None and target.ring is None:
            self._own.setdefault(name, path)
        return path

    def frozen(self) -> RingPaths:
        """The ring paths as they are now, for reading away from the loop (a copy of the
        kept paths: no Python work per target)."""
        return RingPaths(self.run_dir, dict(self._own))

    def ensure(self, name: str) -> None:
        """Create the ring of `name` if it has none (TargetError if it cannot)."""
        path = self.path(name)
        if not path.is_file() or path.is_symlink():
            try:
                create_ring(path, self.capacity)
            except OSError as e:
                raise TargetError(f"cannot create the ring for {name}: {e}") from None

    def remove(self, target: Target) -> None:
        """`target` was unset: its own ring goes with it (a volume's is the volume
        driver's)."""
        path = self._own.pop(target.name, None)
        if target.ring is not None:
            return
        path = path or ring_path(self.run_dir, ring_dir_name(target.name))
        with contextlib.suppress(OSError):  # a container still has it open: harmless
            path.unlink()
            path.parent.rmdir()


@dataclass(frozen=True)
class RingPaths:
    """The ring paths of the targets at one time (`Rings.frozen`)."""

    run_dir: Path
    own: dict[str, Path]

    def of(self, target: Target) -> Path:
        return _ring_of(self.run_dir, self.own, target.name, target)


def _ring_of(run_dir: Path, own: dict[str, Path], name: str, target: Target | None) -> Path:
    """The ring of `name`: its target's volume's, else its own (kept, or where it would be)."""
    if target is not None and target.ring is not None:
        return Path(target.ring)
    return own.get(name) or ring_path(run_dir, ring_dir_name(name))
