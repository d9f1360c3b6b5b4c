"""Checks every policy must pass, shared by the policies' tests."""

from __future__ import annotations

import tracemalloc

from dqoes_cg.policy import Observation, Policy

ARRAY_BYTES = 16_000  # below one float64 array of the tests' 20,000 slots (160 kB)


def assert_decides_without_allocating(pol: Policy, obs: Observation) -> None:
    """Rounds after the first refill the first round's buffers and allocate no array."""
    first = pol.decide(obs, 0.0)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for k in range(1, 6):
            pol.reset()
            assert pol.decide(obs, float(k)) is first  # the same buffers, refilled
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak - base < ARRAY_BYTES
