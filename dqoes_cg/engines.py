"""What dqoesd does with container engines, put together: follow one engine's containers
and services (watcher.py), serve it the dqoes volume driver (volumes.py), and ask the
engines for container names (cgroup.Runtime), Docker's first, then Podman's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from .cgroup import CgroupError, Resolved, Runtime, find_cgroup2_mount, resolve
from .config import Config
from .engine import Engine, EngineError
from .volumes import SOCKET_NAME, VolumeDriver, VolumePlugin, default_mounts
from .watcher import Watcher

log = logging.getLogger(__name__)

NAME_TIMEOUT_S = 2.0  # a name asked of an engine while a request waits


class Docker:
    """The engine at `socket` (Docker's or Podman's), followed; Podman's at `podman`
    asked for names too when it is another one."""

    def __init__(self, cfg: Config, socket: Path, podman: Path | None) -> None:
        mount = cfg.mount or find_cgroup2_mount()
        self.engine = Engine(socket, "Podman" if "podman" in str(socket) else "Docker")
        self.driver = VolumeDriver(cfg.run_dir, cfg.ring_capacity, default_mounts())
        self.watcher = Watcher(self.engine, lambda pid: _cgroup_of(pid, mount),
                               self.driver.ring)
        self.plugin: VolumePlugin | None = None
        self._plugin_path = cfg.run_dir / SOCKET_NAME
        self.runtimes: tuple[Runtime, ...] = (
            Runtime(str(self.engine), self._find),
            *([Runtime(f"Podman (API at {podman})", _asker(Engine(podman, "Podman",
                                                                  NAME_TIMEOUT_S)))]
              if podman is not None and podman != socket else []))

    def start(self) -> None:
        self.plugin = VolumePlugin(self.driver, self._plugin_path)
        self.watcher.start()
        log.info("volume driver dqoes at %s; following %s", self._plugin_path, self.engine)

    def close(self) -> None:
        self.watcher.close()
        if self.plugin is not None:
            self.plugin.close()

    def _find(self, name: str) -> str | None:
        """The watcher's view when it has one (no I/O), else the engine's answer."""
        if self.watcher.connected.is_set():
            return self.watcher.container_id(name)
        return _asker(Engine(self.engine.path, self.engine.runtime, NAME_TIMEOUT_S))(name)


def _asker(engine: Engine) -> Callable[[str], str | None]:
    def find(name: str) -> str | None:
        try:
            c = engine.inspect(name)
        except EngineError as e:
            raise CgroupError(str(e).split(": ", 1)[-1]) from None
        return None if c is None else c.id
    return find


def _cgroup_of(pid: int, mount: Path) -> Resolved | CgroupError:
    if pid <= 0:
        return CgroupError("not running")
    try:
        return resolve(str(pid), mount)
    except CgroupError as e:
        return e
