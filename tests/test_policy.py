"""DQoES policy: Algorithm 1 against hand-computed rounds and the per-container loop oracle,
Algorithm 2's transitions, the Policy object, and a fluid model of the paper's scenarios."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.policy_loop import algorithm1_loop, compare
from dqoes_cg.policy import Cls, Observation
from dqoes_cg.policy.dqoes import (
    DQoES,
    Listener,
    Round,
    Workspace,
    algorithm1,
    algorithm1_into,
)
from tests.policy_checks import assert_decides_without_allocating

G, S, B, IDLE = Cls.G, Cls.S, Cls.B, Cls.IDLE
NAN = math.nan


def check(target, measured, usage, limit, alpha=0.1, beta=0.1):
    """Algorithm 1 on the inputs; asserts the loop oracle agrees, returns the numpy result."""
    assert compare(target, measured, usage, limit, alpha, beta) < 1e-12
    limits, classes, totals = algorithm1(target, measured, usage, limit, alpha, beta)
    return limits, classes.tolist(), totals


# --- Algorithm 1: hand-computed rounds -------------------------------------------------


def test_hand_computed_round():
    # n = 5, floor 0.1. G: c0 (q 0.5, binding min(0.25, 0.2) = 0.2) and c1 (q 0.5 > 0.2);
    # S: c2 (|q| 0.05 <= 0.1); B: c3 (q -1); idle: c4 (no requests).
    # Q_G = 1, R_G = 0.5, Q_B = -1, R_B = 0.3: G factor 1 - 0.5·0.5·0.1 = 0.975,
    # B factor 1 + 1·0.5·0.1 = 1.05.
    limits, classes, totals = check(
        target=[1.0, 2.0, 1.0, 1.0, 1.0],
        measured=[0.5, 1.5, 1.05, 2.0, NAN],
        usage=[0.2, 0.3, 0.1, 0.3, 0.05],
        limit=[0.25, 0.3, 0.1, 0.3, 0.2],
    )
    assert classes == [G, G, S, B, IDLE]
    assert limits == pytest.approx([0.2 * 0.975, 0.3 * 0.975, 0.1, 0.3 * 1.05, 0.2])
    assert totals == pytest.approx(Round(q_g=1.0, q_b=-1.0, r_g=0.5, r_b=0.3, satisfied=1))


@pytest.mark.parametrize(("inputs", "classes", "limits"), [
    # alpha 0.05. Two G with q 0.3 and 0.1 (Q_G 0.4, R_G 0.4): cuts of 0.75·0.04 and
    # 0.25·0.04. Two B with q -0.6 and -0.2 (Q_B -0.8): growths of 0.75·0.04 and 0.25·0.04.
    pytest.param(dict(target=[1.0] * 4, measured=[0.7, 0.9, 1.6, 1.2], usage=[0.2] * 4,
                      limit=[0.2] * 4, alpha=0.05),
                 [G, G, B, B], [0.2 * 0.97, 0.2 * 0.99, 0.2 * 1.03, 0.2 * 1.01],
                 id="gap-shares-split-the-step"),
    # n = 4: floor 1/8. A cut that would land below it stops at it; a G container whose
    # limit already sits below the floor is raised to it (the paper's lines 19-20).
    pytest.param(dict(target=[1.0] * 4, measured=[0.1, 0.1, 1.0, 1.0],
                      usage=[0.13, 0.05, 0.3, 0.3], limit=[0.13, 0.05, 0.3, 0.3], beta=1.0),
                 [G, G, S, S], [0.125, 0.125, 0.3, 0.3], id="g-floor"),
])
def test_round(inputs, classes, limits):
    got_limits, got_classes, _ = check(**inputs)
    assert got_classes == classes
    assert got_limits == pytest.approx(limits)


def test_all_b_on_busy_cpus_changes_nothing():
    # B grows by R_G, which is 0, and no CPU is idle: the paper's unachievable run stays at
    # an even share, even where a container uses less than its cap.
    limit = [0.25, 0.3, 0.25, 0.3]
    limits, classes, totals = check([20.0] * 4, [31.6, 35.0, 40.0, 31.6],
                                    [0.25, 0.25, 0.25, 0.25], limit)
    assert classes == [B] * 4
    assert limits.tolist() == limit
    assert totals.q_g == 0.0 and totals.r_g == 0.0


def test_all_b_takes_the_idle_cpu_by_its_gap():
    # Caps of 0.2 each leave 0.4 of the budget idle and no G gives anything: B takes the
    # idle 0.4 at once, split by q_i/Q_B (1/4 and 3/4).
    limits, classes, _ = check([1.0, 1.0, 1.0], [2.0, 4.0, 1.0], [0.2, 0.2, 0.2],
                               [0.2, 0.2, 0.2])
    assert classes == [B, B, S]
    assert limits.tolist() == pytest.approx([0.3, 0.5, 0.2])


def test_idle_cpu_is_left_to_the_papers_rule_while_g_gives():
    limits, classes, _ = check([1.0, 1.0], [0.5, 2.0], [0.3, 0.3], [0.3, 0.3])
    assert classes == [G, B]
    assert limits.tolist() == pytest.approx([0.3 * (1 - 0.03), 0.3 * (1 + 0.03)])


def test_g_and_s_only_leaves_s_alone():
    limits, classes, _ = check([1.0, 1.0], [0.2, 1.0], [0.5, 0.5], [0.5, 0.5])
    assert classes == [G, S]
    assert limits[1] == 0.5
    assert limits[0] == pytest.approx(0.5 * (1 - 0.5 * 0.1))


def test_s_band_is_closed():
    # |q| = alpha·o exactly is S (alpha = 0.25 keeps the arithmetic exact).
    _, classes, totals = check([1.0, 1.0, 1.0, 1.0], [0.75, 1.25, 0.74, 1.26],
                               [0.2] * 4, [0.2] * 4, alpha=0.25)
    assert classes == [S, S, G, B]
    assert totals.satisfied == 2


def test_b_cap():
    # One G frees R_G = 0.5 with beta 1: the lone B grows by half, capped at T_R = 1.
    limits, classes, _ = check([1.0, 1.0], [0.1, 5.0], [0.5, 0.8], [0.5, 0.8], beta=1.0)
    assert classes == [G, B]
    assert limits[1] == 1.0


def test_g_is_cut_from_the_binding_limit():
    # An unlimited G container (L = T_R) using 0.2 is cut from 0.2, not from 1.0.
    limits, classes, _ = check([1.0, 1.0, 1.0], [0.5, 1.0, 1.0], [0.2, 0.4, 0.4],
                               [1.0, 0.4, 0.4])
    assert classes == [G, S, S]
    assert limits[0] == pytest.approx(0.2 * (1 - 0.2 * 0.1))


def test_b_grows_from_its_limit_not_its_usage():
    # A B container using less than its cap (CFS, not its cap, holds it back) keeps growing
    # from the cap: its cap never falls while it misses its target.
    limits, classes, _ = check([1.0, 1.0, 1.0], [0.5, 2.0, 1.0], [0.3, 0.2, 0.3],
                               [0.3, 0.4, 0.3])
    assert classes == [G, B, S]
    assert limits[1] == pytest.approx(0.4 * (1 + 0.3 * 0.1))


def test_limits_may_sum_past_the_budget():
    limits, _, _ = check([1.0] * 3, [0.5, 3.0, 3.0], [0.4, 0.3, 0.3], [0.4, 0.6, 0.6],
                         beta=1.0)
    assert limits.sum() > 1.0  # caps, not shares: no renormalisation


@pytest.mark.parametrize(
    ("target", "measured", "usage"),
    [(1.0, NAN, 0.1), (NAN, 0.5, 0.1), (1.0, math.inf, 0.1), (1.0, -math.inf, 0.1),
     (math.inf, 0.5, 0.1), (1.0, 0.5, NAN)],
    ids=["no-requests", "no-target", "inf-latency", "neg-inf-latency", "inf-target",
         "no-usage"],
)
def test_unusable_measurement_is_idle_and_left_alone(target, measured, usage):
    # Slot 0 would otherwise dwarf the others' gaps; as idle it is in no class nor sum.
    limits, classes, totals = check([target, 1.0, 1.0], [measured, 0.5, 2.0],
                                    [usage, 0.3, 0.3], [0.3, 0.3, 0.3])
    assert classes == [IDLE, G, B]
    assert limits[0] == 0.3
    assert totals == pytest.approx(Round(q_g=0.5, q_b=-1.0, r_g=0.3, r_b=0.3, satisfied=0))
    assert np.isfinite(limits).all()


def test_empty_worker():
    limits, classes, totals = algorithm1([], [], [], [])
    assert limits.size == 0 and classes.size == 0
    assert totals == Round(0.0, 0.0, 0.0, 0.0, 0)


def test_output_may_alias_the_limit_input():
    rng = np.random.default_rng(7)
    n = 50
    target = rng.uniform(0.1, 1.0, n)
    measured = target * rng.uniform(0.5, 1.5, n)
    limit = rng.uniform(0.01, 0.05, n)
    usage = limit * rng.uniform(0.5, 1.0, n)
    expected, _, _ = algorithm1(target, measured, usage, limit)
    classes = np.empty(n, dtype=np.int8)
    algorithm1_into(target, measured, usage, limit, alpha=0.1, beta=0.1,
                    ws=Workspace.sized(n), limits_out=limit, classes_out=classes)
    assert limit.tolist() == expected.tolist()


# --- Algorithm 1: vectorized against the per-container loop ------------------------------

latency = st.one_of(st.floats(0.0, 100.0), st.just(NAN))


@st.composite
def workers(draw):
    n = draw(st.integers(1, 40))
    target = draw(st.lists(st.floats(1e-3, 100.0), min_size=n, max_size=n))
    measured = draw(st.lists(latency, min_size=n, max_size=n))
    limit = draw(st.lists(st.floats(1e-3, 1.0), min_size=n, max_size=n))
    usage = [lim * draw(st.floats(0.0, 1.05)) for lim in limit]  # a little noise past caps
    alpha = draw(st.floats(0.0, 0.5))
    beta = draw(st.floats(0.01, 1.0))
    return target, measured, usage, limit, alpha, beta


@settings(max_examples=300, deadline=None)
@given(workers())
def test_vectorized_matches_loop(worker):
    target, measured, usage, limit, alpha, beta = worker
    assert compare(target, measured, usage, limit, alpha, beta) < 1e-9
    limits, classes, _ = algorithm1(target, measured, usage, limit, alpha, beta)
    n = len(target)
    assert ((limits >= 0.5 / n) | (classes != G)).all()
    assert (limits <= 1.0).all()
    untouched = (classes == S) | (classes == IDLE)
    assert (limits[untouched] == np.asarray(limit)[untouched]).all()


def test_loop_oracle_on_hand_case():
    limits, classes, totals = algorithm1_loop([1.0, 1.0], [0.5, 2.0], [0.3, 0.3], [0.3, 0.3])
    assert classes == [G, B]
    assert limits == pytest.approx([0.3 * (1 - 0.03), 0.3 * (1 + 0.03)])
    assert totals.satisfied == 0


# --- Algorithm 2: the listener ------------------------------------------------------------


def shrinking(listener: Listener, rounds: int, start: float = 10.0) -> None:
    """Feed rounds in which Q_G falls and Q_B rises towards 0, |S| steady."""
    for k in range(rounds):
        listener.observe(start - k, -start + k, 3)


def test_listener_doubles_after_three_shrinking_rounds():
    lis = Listener(iv_initial=10.0, iv_max=1000.0)
    lis.observe(10.0, -10.0, 3)  # the first round has nothing to compare with
    shrinking(lis, 3, start=9.0)
    assert lis.interval == 20.0
    shrinking(lis, 2, start=6.0)  # the streak restarted after doubling
    assert lis.interval == 20.0
    shrinking(lis, 1, start=4.0)
    assert lis.interval == 40.0


def test_listener_streak_needs_both_gaps_shrinking_in_a_row():
    lis = Listener(iv_initial=10.0)
    for q_g, q_b in [(10, -10), (9, -9), (8, -8), (8, -7), (7, -6), (6, -5)]:
        lis.observe(q_g, q_b, 3)
    assert lis.interval == 10.0  # Q_G stalled at round 4: the streak began again
    lis.observe(5, -4, 3)
    assert lis.interval == 20.0


def test_listener_ceiling():
    lis = Listener(iv_initial=10.0, iv_max=30.0)
    shrinking(lis, 1 + 3 * 4)
    assert lis.interval == 30.0


def test_listener_resets_when_s_falls():
    lis = Listener(iv_initial=10.0)
    shrinking(lis, 4)
    assert lis.interval == 20.0
    assert lis.observe(7.0, -7.0, 3) is False  # neither shrinking nor |S| falling
    assert lis.observe(7.0, -7.0, 2) is True
    assert lis.interval == 10.0


def test_listener_shrinking_gaps_win_over_a_fall_of_s():
    lis = Listener(iv_initial=10.0)
    lis.observe(10.0, -10.0, 5)
    assert lis.observe(9.0, -9.0, 4) is False  # checked first, as in the paper


def test_listener_steady_empty_classes_do_not_count_as_shrinking():
    lis = Listener(iv_initial=10.0)
    for _ in range(10):
        lis.observe(0.0, 0.0, 10)  # everything in S: Q_G and Q_B stay at 0
    assert lis.interval == 10.0


def test_listener_reset_forgets_and_is_due_at_once():
    lis = Listener(iv_initial=10.0)
    shrinking(lis, 4)
    lis.schedule(100.0)
    assert not lis.due(119.9) and lis.due(120.0)
    lis.reset()
    assert lis.interval == 10.0 and lis.due(0.0)
    assert lis.observe(1.0, -1.0, 0) is False  # no earlier round to compare |S| with


@pytest.mark.parametrize(("iv_initial", "iv_max"), [(0.0, 10.0), (10.0, 5.0), (-1.0, 1.0),
                                                    (10.0, math.inf), (NAN, 10.0)])
def test_listener_rejects_bad_intervals(iv_initial, iv_max):
    with pytest.raises(ValueError):
        Listener(iv_initial, iv_max)


# --- The DQoES policy object ---------------------------------------------------------------


def observation(n: int, seed: int = 0) -> Observation:
    rng = np.random.default_rng(seed)
    target = rng.uniform(0.1, 1.0, n)
    measured = target * rng.uniform(0.5, 1.5, n)
    measured[::7] = NAN
    limit = np.full(n, 1.0 / n)
    return Observation(target, measured, limit * 0.9, limit)


def test_decide_runs_when_due_and_schedules_the_next_round():
    pol = DQoES(iv_initial=10.0)
    pol.resize(20)
    obs = observation(20)
    d = pol.decide(obs, now=100.0)
    assert d is not None
    expected, classes, totals = algorithm1(obs.target, obs.measured, obs.usage, obs.limit)
    assert d.limits.tolist() == expected.tolist()
    assert d.classes.tolist() == classes.tolist()
    assert d.totals == totals._asdict()
    np.testing.assert_array_equal(d.score, obs.target - obs.measured)
    assert d.interval == 10.0
    assert not pol.due(109.9) and pol.decide(obs, now=109.9) is None
    assert pol.due(110.0) and pol.decide(obs, now=110.0) is not None


def test_reset_and_resize_make_the_policy_due_at_once():
    pol = DQoES()
    pol.resize(5)
    pol.decide(observation(5), now=0.0)
    pol.reset()
    assert pol.decide(observation(5), now=0.1) is not None
    pol.resize(8)
    d = pol.decide(observation(8), now=0.2)
    assert d is not None and d.limits.shape == (8,) and d.classes.dtype == np.int8


def test_decide_rejects_arrays_of_the_wrong_size():
    pol = DQoES()
    pol.resize(4)
    with pytest.raises(ValueError):
        pol.decide(observation(5), now=0.0)


def test_decide_allocates_no_arrays():
    n = 20000  # one float64 array of n would be 160 kB
    pol = DQoES()
    pol.resize(n)
    obs = observation(n)
    assert_decides_without_allocating(pol, obs)


def test_first_limits_are_the_policys():
    """A limit the loop never set (NaN) becomes max(usage share, even share), at most T_R,
    for a container that measured something; one that measured nothing is left alone."""
    pol = DQoES()
    pol.resize(5)
    target = np.full(5, 1.0)
    measured = np.array([1.0, 1.0, 1.0, 1.0, NAN])  # all in S but the last (idle)
    obs = Observation(target, measured, np.array([0.1, 0.4, NAN, 1.3, 0.3]), np.full(5, NAN))
    d = pol.decide(obs, now=0.0)
    assert d is not None
    assert d.limits[:4].tolist() == [0.2, 0.4, 0.2, 1.0]  # even, usage, unknown: even, cap
    assert np.isnan(d.limits[4])  # measured nothing: left alone


@pytest.mark.parametrize(("alpha", "beta"), [(-0.1, 0.1), (0.1, 0.0), (0.1, 1.5),
                                             (NAN, 0.1), (0.1, NAN)])
def test_policy_rejects_bad_parameters(alpha, beta):
    with pytest.raises(ValueError):
        DQoES(alpha=alpha, beta=beta)


# --- A fluid model of the paper's single-node scenarios ---------------------------------------

WORK = 3.161  # CPU-seconds (in budget fractions) per request: 31.61 s at an even 1/10 share


def fair_share(limits: np.ndarray) -> np.ndarray:
    """CFS as a fluid: every container busy, each gets min(its cap, an equal split of what
    the tighter caps leave)."""
    alloc, left = np.zeros_like(limits), 1.0
    for k, i in enumerate(np.argsort(limits)):
        alloc[i] = min(limits[i], left / (len(limits) - k))
        left -= alloc[i]
    return alloc


def run_fluid(targets: list[float], rounds: int) -> tuple[list[list[int]], np.ndarray]:
    """Classes each round and the final limits, from limits set at join."""
    pol = DQoES()
    pol.resize(len(targets))
    target = np.array(targets)
    limits = np.full(len(targets), NAN)  # the policy sets the first limits
    history = []
    for k in range(rounds):
        usage = fair_share(np.nan_to_num(limits, nan=1.0))
        obs = Observation(target, WORK / usage, usage, limits)
        pol.reset()  # one round per step: the listener's timing is not modelled here
        d = pol.decide(obs, now=float(k))
        assert d is not None
        limits = d.limits.copy()
        history.append(d.classes.tolist())
    return history, limits


def test_fluid_identical_achievable_targets_all_reach_s():
    history, limits = run_fluid([40.0] * 10, rounds=40)
    first = next(k for k, classes in enumerate(history) if classes == [S] * 10)
    assert first <= 30
    assert all(classes == [S] * 10 for classes in history[first:])
    assert limits == pytest.approx(np.full(10, limits[0]))  # identical containers, same cap


def test_fluid_unachievable_targets_stay_in_b_at_an_even_share():
    history, limits = run_fluid([20.0] * 10, rounds=40)
    assert all(classes == [B] * 10 for classes in history)
    assert limits == pytest.approx(np.full(10, 0.1), rel=1e-12)
