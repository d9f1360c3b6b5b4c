"""Report request latencies to dqoes-cg from a Python service (the producer side of a ring).

    from dqoes_cg.probe import Probe

    probe = Probe.open()          # $DQOES_RING, else /run/dqoes/ring
    with probe.measure():         # times the block
        reply = model(request)

    @probe.measure()              # times every call (async functions too)
    def handle(request): ...

    probe.record(0.042)           # a latency measured elsewhere, in seconds

    probe.progress(loss)          # a training job: its evaluation value after a step or epoch

A record is one C call (clock read, atomic add, four stores). Without a ring at the path
(outside dqoes-cg), or without the compiled extension, recording does nothing, so the
service runs unchanged; the probe looks at the path again about once a second and attaches
to a ring that appears later. Threads may share a probe, and so may processes forked
after `open`. Ring format: docs/ring-format.md.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

try:
    from dqoes_cg._native import ffi, lib
except ImportError:  # not built: every probe is a no-op
    ffi = lib = None

DEFAULT_PATH = "/run/dqoes/ring"
ENV_VAR = "DQOES_RING"

F = TypeVar("F", bound=Callable[..., Any])


class Probe:
    """A handle on the container's ring. Use `Probe.open`, not the constructor."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None) -> Probe:
        """A probe on the ring at `path` (default: $DQOES_RING, else DEFAULT_PATH)."""
        if lib is None:
            return cls(None)
        handle = lib.dq_probe_open(os.fsencode(path) if path else ffi.NULL)
        if handle == ffi.NULL:
            raise MemoryError("dqoes probe")
        return cls(ffi.gc(handle, lib.dq_probe_close))

    @property
    def attached(self) -> bool:
        """Whether records currently go into a ring."""
        return self._handle is not None and bool(lib.dq_probe_attached(self._handle))

    def record(self, seconds: float) -> None:
        """Records one request's latency. A value that is not in (0 s, 1 h] (negative, NaN,
        infinite) is not written but counted in the ring's dropped counter."""
        if self._handle is not None:
            lib.dq_probe_record_seconds(self._handle, seconds)

    def record_ns(self, nanoseconds: int) -> None:
        """`record` for a latency in integer nanoseconds."""
        if self._handle is not None:
            lib.dq_probe_record_ns(self._handle, nanoseconds)

    def progress(self, value: float) -> None:
        """Records a training job's evaluation value (loss, accuracy...) now. A value that
        is not finite (NaN, infinite) is not written but counted in the ring's dropped
        counter."""
        if self._handle is not None:
            lib.dq_probe_progress(self._handle, value)

    def measure(self) -> Measure:
        """Times a `with` block, or every call of a function it decorates, and records it
        (also when it raises: a failed request was still waited for)."""
        return Measure(self)

    def close(self) -> None:
        """Detaches; later records do nothing. No other thread may be recording."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            ffi.release(handle)

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Measure(contextlib.ContextDecorator):
    """What `Probe.measure` returns. As a decorator, each call is timed separately."""

    def __init__(self, probe: Probe) -> None:
        self._probe = probe
        self._start = 0

    def _recreate_cm(self) -> Measure:
        return Measure(self._probe)

    def __enter__(self) -> Measure:
        self._start = time.perf_counter_ns()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._probe.record_ns(time.perf_counter_ns() - self._start)

    def __call__(self, func: F) -> F:
        if not inspect.iscoroutinefunction(func):
            return super().__call__(func)

        @functools.wraps(func)
        async def timed(*args: Any, **kwargs: Any) -> Any:
            with self._recreate_cm():
                return await func(*args, **kwargs)

        return timed  # type: ignore[return-value]
