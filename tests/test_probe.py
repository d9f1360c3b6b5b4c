"""The Python producer (dqoes_cg.probe)."""

from __future__ import annotations

import asyncio
import multiprocessing
import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dqoes_cg import probe as probe_module
from dqoes_cg.probe import DEFAULT_PATH, ENV_VAR, Probe
from dqoes_cg.ring import RECORD_DTYPE, RingSet, Status, create_ring, ring_path

HEADER = Path(__file__).resolve().parent.parent / "csrc" / "dqoes_probe.h"


@pytest.fixture
def rings(tmp_path: Path) -> Iterator[RingSet]:
    with RingSet([ring_path(tmp_path, "app")], 256) as rings:
        yield rings


def latencies(rings: RingSet) -> list[int]:
    records = np.zeros(256, RECORD_DTYPE)
    return records[:rings.drain(records=records)]["latency_ns"].tolist()


def test_defaults_agree_with_the_c_header() -> None:
    text = HEADER.read_text()
    assert re.search(rf'#define DQOES_RING_DEFAULT_PATH\s+"{DEFAULT_PATH}"', text)
    assert re.search(rf'#define DQOES_RING_ENV\s+"{ENV_VAR}"', text)


def test_without_a_ring_recording_does_nothing(tmp_path: Path) -> None:
    with Probe.open(tmp_path / "absent") as probe:
        assert not probe.attached
        probe.record(0.01)
        probe.record_ns(5)
        with probe.measure():
            pass


def test_without_the_extension_the_probe_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe_module, "lib", None)
    probe = Probe.open()
    assert not probe.attached
    probe.record(1.0)
    probe.close()


def test_the_environment_names_the_ring(rings: RingSet, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(rings.paths[0]))
    with Probe.open() as probe:
        assert probe.attached
        probe.record(0.25)
    assert latencies(rings) == [250_000_000]


def test_measure_times_blocks_and_calls(rings: RingSet) -> None:
    probe = Probe.open(rings.paths[0])
    with probe.measure():
        time.sleep(0.01)
    with pytest.raises(KeyError), probe.measure():
        raise KeyError("a failed request is still measured")

    @probe.measure()
    def handle(x: int) -> int:
        return x + 1

    @probe.measure()
    async def handle_async() -> str:
        await asyncio.sleep(0.02)
        return "done"

    assert handle(1) == 2 and handle(2) == 3
    assert handle.__name__ == "handle"
    assert asyncio.run(handle_async()) == "done"
    got = latencies(rings)
    assert len(got) == 5
    assert 10_000_000 <= got[0] < 1_000_000_000
    assert 20_000_000 <= got[4] < 1_000_000_000
    probe.close()
    probe.close()
    probe.record(1.0)
    assert latencies(rings) == []


def _record_in_child(probe: Probe) -> None:
    probe.record_ns(777)


def test_a_forked_process_records_through_the_parents_probe(rings: RingSet) -> None:
    with Probe.open(rings.paths[0]) as probe:
        child = multiprocessing.get_context("fork").Process(target=_record_in_child,
                                                            args=(probe,))
        child.start()
        child.join()
        assert child.exitcode == 0
    assert latencies(rings) == [777]


def test_a_probe_attaches_to_a_ring_that_appears_or_is_recreated(tmp_path: Path) -> None:
    path = ring_path(tmp_path, "late")
    probe = Probe.open(path)
    probe.record_ns(1)
    assert not probe.attached
    create_ring(path, 64)
    time.sleep(1.05)  # the probe looks at its path again once a second
    probe.record_ns(2)
    assert probe.attached
    with RingSet([path], 64) as rings:
        assert rings.records[0] == 0  # reading starts at the current position
        probe.record_ns(3)
        assert latencies(rings) == [3]
        create_ring(path, 64)  # e.g. after the container broke its ring
        probe.record_ns(4)  # into the old file, for up to a second: lost
        time.sleep(1.05)
        probe.record_ns(5)  # into the new file, before the reader looks: skipped
        assert latencies(rings) == []
        assert (rings.faults[0], rings.last_fault[0], rings.status[0]) == (
            1, Status.REPLACED, Status.OK)
        probe.record_ns(6)
        assert latencies(rings) == [6]
    probe.close()
