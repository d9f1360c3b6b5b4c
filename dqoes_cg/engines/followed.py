"""What dqoesd does with container engines, put together: follow one engine's containers
and services (watcher.py), serve it the dqoes volume driver (volume_driver.py), and ask the
engines for container names (cgroup.Runtime), the followed one's first, then Podman's.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from ..cgroup import CgroupError, Resolved, Runtime, find_cgroup2_mount, resolve
from ..config import Config
from .client import Container, Engine, EngineError
from .volume_driver import SOCKET_NAME, VolumeDriver, VolumePlugin, default_mounts
from .watcher import Watcher

log = logging.getLogger(__name__)

NAME_TIMEOUT_S = 2.0  # for an engine's answer to a name
ANSWER_WAIT_S = 0.25  # the daemon's loop waits for it, at most


class FollowedEngine:
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
        self._ask = NameAsker(Engine(socket, self.engine.runtime, NAME_TIMEOUT_S))
        self.runtimes: tuple[Runtime, ...] = (
            Runtime(str(self.engine), self._find),
            *([Runtime(f"Podman (API at {podman})",
                       NameAsker(Engine(podman, "Podman", NAME_TIMEOUT_S)))]
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
        return self._ask(name)


class NameAsker:
    """Asks `engine` for the ID of a container by name (`find` of a Runtime) from the
    daemon's loop: the question goes out in a thread of its own, and the loop waits at most
    ANSWER_WAIT_S for its answer, so a silent engine stalls no tick. While a question is
    out, the next is refused at once: a silent engine holds one thread, not one each."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._out = False

    def __call__(self, name: str) -> str | None:
        with self._lock:
            if self._out:
                raise CgroupError("has not answered the last question yet")
            self._out = True
        answers: list[Container | EngineError | None] = []
        answered = threading.Event()
        threading.Thread(target=self._ask, args=(name, answers, answered),
                         name="dqoes-name", daemon=True).start()
        if not answered.wait(ANSWER_WAIT_S):
            raise CgroupError(f"did not answer within {ANSWER_WAIT_S} s (with --pending, "
                              "the name is looked for again later)")
        answer = answers[0]
        if isinstance(answer, EngineError):
            raise CgroupError(str(answer).split(": ", 1)[-1])
        return None if answer is None else answer.id

    def _ask(self, name: str, answers: list[Container | EngineError | None],
             answered: threading.Event) -> None:
        try:
            answers.append(self.engine.inspect(name))
        except EngineError as e:
            answers.append(e)
        finally:
            with self._lock:
                self._out = False
            answered.set()


def _cgroup_of(pid: int, mount: Path) -> Resolved | CgroupError:
    if pid <= 0:
        return CgroupError("not running")
    try:
        return resolve(str(pid), mount)
    except CgroupError as e:
        return e
