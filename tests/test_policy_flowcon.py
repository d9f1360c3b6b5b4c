"""FlowCon (policy/flowcon.py) against the paper's rules one by one: Eq. (1) and (2),
Algorithm 3's threshold, Algorithm 1's lists and limits, Algorithm 2's listener and the
back-off; and one host of both kinds (policy/mixed.py): the budget split, its guarantees
and how training gives way to a service that misses its target."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dqoes_cg.policy import Cls, DQoES, FlowCon, Mixed, Observation, make_policy
from dqoes_cg.policy.flowcon import (
    growth_into,
    progress_into,
    threshold,
    water_fill,
)
from tests.policy_checks import assert_decides_without_allocating

NL, WL, CL, IDLE, G, S, B = Cls.NL, Cls.WL, Cls.CL, Cls.IDLE, Cls.G, Cls.S, Cls.B
NAN = math.nan


def jobs(lists: Sequence[int], growth: Sequence[float], usage: Sequence[float] | None = None,
         training: Sequence[bool] | None = None, target: Sequence[float] | None = None,
         measured: Sequence[float] | None = None, limit: Sequence[float] | None = None,
         ) -> Observation:
    """An observation whose training jobs reported a fall of `growth`·usage over one second
    (so that G = growth, or no report where growth is NaN)."""
    n = len(lists)
    usage_a = np.full(n, 0.5) if usage is None else np.array(usage, float)
    g = np.array(growth, float)
    return Observation(
        target=np.full(n, NAN) if target is None else np.array(target, float),
        measured=np.full(n, NAN) if measured is None else np.array(measured, float),
        usage=usage_a, limit=np.full(n, NAN) if limit is None else np.array(limit, float),
        training=None if training is None else np.array(training, bool),
        classes=np.array(lists, np.int8), eval_prev=np.full(n, 10.0),
        eval_prev_at=np.full(n, 100.0), eval_last=10.0 - g * usage_a,
        eval_last_at=np.full(n, 101.0))


def one_round(obs: Observation, pol: FlowCon | None = None, now: float = 0.0):
    pol = pol or FlowCon()
    if pol.ws.valid.shape[0] != obs.usage.shape[0]:
        pol.resize(obs.usage.shape[0])
    d = pol.decide(obs, now)
    assert d is not None
    return d


# --- Eq. (1) and (2) ---------------------------------------------------------------------


def test_progress_is_the_change_of_the_evaluation_per_second() -> None:
    prev = np.array([2.0, 0.50, 1.0, 1.0, 1.0, 1.0, 1.0, 1e308])
    prev_at = np.array([10.0, 10.0, NAN, 10.0, 10.0, 12.0, 10.0, 10.0])
    last = np.array([1.0, 0.75, 0.5, NAN, 0.5, 0.5, 1.0, -1e308])
    last_at = np.array([14.0, 12.0, 14.0, 14.0, 10.0, 10.0, 12.0, 11.0])
    out, x, flag = np.zeros(8), np.zeros(8), np.zeros(8, bool)
    progress_into(prev, prev_at, last, last_at, out, x, flag)
    # a falling loss and a rising accuracy alike; a time or value missing, no time between
    # the two or time going backwards, and a difference that overflows: not measured; no
    # change: zero progress
    assert out[:2].tolist() == [0.25, 0.125]
    assert np.isnan(out[2:6]).all() and out[6] == 0.0 and np.isnan(out[7])


def test_growth_efficiency_is_progress_per_unit_of_cpu() -> None:
    progress = np.array([0.2, 0.2, 0.2, NAN, 0.0])
    usage = np.array([0.5, 0.1, 0.0, 0.5, 0.5])
    out, flag = np.zeros(5), np.zeros(5, bool)
    growth_into(progress, usage, out, flag)
    assert out[:2] == pytest.approx([0.4, 2.0])
    assert np.isnan(out[2:4]).all() and out[4] == 0.0  # no CPU used: not measured


# --- Algorithm 3: the threshold ----------------------------------------------------------


def _threshold(lists: Sequence[int], growth: Sequence[float]) -> float:
    g, codes = np.array(growth, float), np.array(lists)
    return threshold(g, np.isfinite(g), codes == NL, codes == WL, np.zeros(len(g), bool),
                     np.zeros(len(g)))


def test_threshold_is_minus_one_when_every_job_completes() -> None:
    assert _threshold([CL, CL], [5.0, 7.0]) == -1.0


def test_threshold_of_one_job_is_half_its_growth() -> None:
    assert _threshold([NL], [0.8]) == 0.4
    assert _threshold([WL], [0.8]) == 0.4


def test_threshold_is_the_mean_of_the_nl_and_wl_means() -> None:
    # mean NL (1 + 3)/2 = 2, mean WL 1, CL not counted: (2 + 1) / 2
    assert _threshold([NL, NL, WL, CL], [1.0, 3.0, 1.0, 100.0]) == 1.5
    assert _threshold([NL, NL, CL], [1.0, 3.0, 100.0]) == 1.0  # empty WL counts 0


def test_threshold_counts_only_measured_jobs_and_waits_for_a_new_one() -> None:
    assert _threshold([NL, NL, WL], [2.0, NAN, 1.0]) == 1.5
    assert math.isnan(_threshold([NL, WL], [NAN, 1.0]))  # NL's only member not measured yet


# --- Algorithm 1: the lists --------------------------------------------------------------


def test_below_the_threshold_nl_goes_to_wl_and_wl_to_cl() -> None:
    # alpha = (mean NL (4 + 0.5)/2 + mean WL (1 + 2)/2) / 2 = 1.875
    d = one_round(jobs([NL, NL, WL, WL, CL], [4.0, 0.5, 1.0, 2.0, 0.1]))
    assert d.totals["threshold"] == pytest.approx(1.875)
    assert d.classes.tolist() == [NL, WL, CL, NL, CL]


def test_at_or_above_the_threshold_every_list_goes_back_to_nl() -> None:
    # alpha = (1 + 1) / 2 = 1: the CL job's G of 1 puts it back in NL
    d = one_round(jobs([NL, WL, CL], [1.0, 1.0, 1.0]))
    assert d.classes.tolist() == [NL, NL, NL]


def test_a_job_without_a_measurement_keeps_its_list() -> None:
    d = one_round(jobs([NL, WL, CL, WL], [4.0, NAN, NAN, 0.1]))
    assert d.classes.tolist() == [NL, WL, CL, CL]
    assert np.isnan(d.score[1:3]).all() and d.score[0] == pytest.approx(4.0)


def test_a_new_job_joins_nl() -> None:
    d = one_round(jobs([IDLE, CL], [NAN, 0.1]))  # a job never decided: class IDLE
    assert d.classes.tolist() == [NL, CL]


def test_a_job_gone_quiet_is_left_out_of_the_round() -> None:
    """A finished job whose cgroup stays (it reported before; no report, no CPU now) counts
    in no list, n or floor: the last job running, in CL, is no longer held at the floor of
    two jobs but competes freely."""
    obs = jobs([NL, CL], [NAN, 0.1], usage=[0.0, 0.2])
    d = one_round(obs)
    assert d.classes.tolist() == [IDLE, CL] and d.totals["completing"] == 1
    assert np.isnan(d.limits[0]) and np.isnan(d.score[0]) and d.limits[1] == 1.0
    mixed = make_policy("dqoes")
    mixed.resize(3)  # beside a service: the training budget goes to the live job alone
    obs = jobs([NL, CL, IDLE], [NAN, 0.1, NAN], usage=[0.0, 0.2, 0.3], training=[1, 1, 0],
               target=[NAN, NAN, 0.1], measured=[NAN, NAN, 0.05], limit=[1.0, 0.2, 0.3])
    d = mixed.decide(obs, 0.0)
    assert d is not None and d.classes[:2].tolist() == [IDLE, CL] and np.isnan(d.limits[0])
    assert d.limits[1] == pytest.approx(d.totals["training_budget"])


def test_a_new_job_that_used_no_cpu_yet_is_not_quiet() -> None:
    obs = jobs([IDLE, CL], [NAN, 0.1], usage=[0.0, 0.5])
    assert obs.eval_prev is not None
    obs.eval_prev[0] = NAN  # it never reported
    d = one_round(obs)
    assert d.classes.tolist() == [NL, CL] and d.limits.tolist() == [1.0, 0.25]


def test_minus_one_switches_the_lists_off() -> None:
    d = one_round(jobs([CL, CL], [10.0, 0.1]))  # a large G, but every job completes
    assert d.classes.tolist() == [CL, CL] and d.totals["threshold"] == -1.0


# --- Algorithm 1: the limits -------------------------------------------------------------


def test_nl_and_wl_get_the_whole_budget_cl_its_share_of_growth() -> None:
    # after the lists: NL (4), WL (1), CL (0.4, 0.1 -> floor); Σ G = 5.5, floor 1/8
    d = one_round(jobs([NL, NL, WL, CL], [4.0, 1.0, 0.4, 0.1]))
    assert d.classes.tolist() == [NL, WL, CL, CL]
    assert d.limits == pytest.approx([1.0, 1.0, 0.125, 0.125])
    d = one_round(jobs([NL, CL, CL], [2.0, 0.8, 0.1]))  # CL 0.8/2.9 is above the floor 1/6
    assert d.classes.tolist() == [NL, CL, CL]
    assert d.limits == pytest.approx([1.0, 0.8 / 2.9, 1 / 6])


def test_cl_gets_its_floor_while_a_new_job_has_no_growth_yet() -> None:
    d = one_round(jobs([CL, CL, IDLE], [0.3, 0.1, NAN]))  # presumed fast: CL at 1/6 each
    assert d.classes.tolist() == [CL, CL, NL]
    assert d.limits == pytest.approx([1 / 6, 1 / 6, 1.0])


def test_the_papers_three_job_run_cl_at_a_quarter_nl_the_rest() -> None:
    """Its Fig. 3: VAE (completing) gets 25% beside the new MNIST job, which takes 75%."""
    d = one_round(jobs([CL, IDLE], [0.01, NAN]))
    assert d.limits.tolist() == [0.25, 1.0]
    assert water_fill(1.0, d.limits).tolist() == [0.25, 0.75]  # what CFS makes of the caps


def test_the_job_with_the_highest_growth_stays_in_nl() -> None:
    """The threshold is at most the mean of a list: some job outside CL always stays or
    comes back in NL, while any job is outside CL."""
    lists = [NL, NL, NL]
    for growth in ([1.0, 0.3, 0.2], [0.9, 0.25, 0.2], [0.8, 0.2, 0.15], [0.1, 0.1, 0.1]):
        d = one_round(jobs(lists, growth))
        lists = d.classes.tolist()
        assert NL in lists
    assert lists == [NL, NL, NL]  # equal growth: all above half the mean


def test_every_job_completing_means_free_competition_and_back_off() -> None:
    """Every job is in CL once the last job outside CL leaves; they stay there (alpha is
    -1) until a job joins."""
    pol = FlowCon(iv_initial=10.0, iv_max=40.0)
    pol.resize(3)
    d = pol.decide(jobs([CL, CL, NL], [0.1, 0.1, 2.0]), now=0.0)
    assert d is not None and d.classes.tolist() == [CL, CL, NL]
    pol.resize(2)  # the NL job finished
    seen = []
    for k in range(4):
        d = pol.decide(jobs([CL, CL], [0.1, 5.0]), now=100.0 * (k + 1))
        assert d is not None
        assert d.classes.tolist() == [CL, CL]  # a large G, but the lists are switched off
        assert d.limits.tolist() == [1.0, 1.0] and d.totals["completing"] == 1
        seen.append(d.interval)
    assert seen == [20.0, 40.0, 40.0, 40.0]  # doubled each round, up to the ceiling


def test_the_interval_holds_while_some_job_is_not_completing() -> None:
    pol = FlowCon(iv_initial=10.0, iv_max=40.0)
    pol.resize(2)
    for k in range(3):
        d = pol.decide(jobs([NL, CL], [1.0, 0.1]), now=100.0 * k)
        assert d is not None and d.interval == 10.0


# --- Algorithm 2: the listener -----------------------------------------------------------


def test_rounds_are_due_one_interval_apart_and_at_once_after_a_change() -> None:
    pol = FlowCon(iv_initial=10.0, iv_max=80.0)
    pol.resize(2)
    for k in range(3):  # every job completing: the interval doubles, 20, 40, 80
        assert pol.decide(jobs([CL, CL], [0.1, 0.1]), now=float(k * 1000)) is not None
    assert pol.interval == 80.0
    assert not pol.due(2079.0) and pol.due(2080.0)
    assert pol.decide(jobs([CL, CL], [0.1, 0.1]), now=2079.0) is None
    pol.resize(3)  # a job joined (or left): back to the first interval, due at once
    assert pol.due(2079.5) and pol.interval == 10.0


def test_lists_follow_the_jobs_through_the_observation() -> None:
    """A policy keeps nothing per job: a job's list comes back with it in obs.classes,
    which the loop carries across membership changes."""
    pol = FlowCon()
    pol.resize(2)
    d = pol.decide(jobs([NL, WL], [4.0, 0.1]), 0.0)
    assert d is not None and d.classes.tolist() == [NL, CL]
    pol.resize(3)  # a new job in the middle slot
    d = pol.decide(jobs([NL, IDLE, CL], [4.0, NAN, 0.1]), 1.0)
    assert d is not None and d.classes.tolist() == [NL, NL, CL]


def test_decide_allocates_no_arrays() -> None:
    n = 20000
    pol = FlowCon()
    pol.resize(n)
    rng = np.random.default_rng(1)
    obs = jobs(rng.choice([NL, WL, CL], n), rng.uniform(0.0, 2.0, n))
    assert_decides_without_allocating(pol, obs)


# --- the water-fill ----------------------------------------------------------------------


def _water_fill_loop(total: float, demand: list[float]) -> list[float]:
    """The max-min fair shares, one container at a time (the reference)."""
    out, left = [0.0] * len(demand), total
    for k, i in enumerate(sorted(range(len(demand)), key=demand.__getitem__)):
        out[i] = min(demand[i], left / (len(demand) - k))
        left -= out[i]
    return out


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 5.0), st.lists(st.floats(0.0, 2.0), min_size=1, max_size=30))
def test_water_fill_is_the_max_min_fair_split(total: float, demand: list[float]) -> None:
    out = water_fill(total, demand)
    assert out == pytest.approx(_water_fill_loop(total, demand), abs=1e-9)
    assert out.sum() <= max(total, sum(demand)) + 1e-9


# --- one host, both kinds ----------------------------------------------------------------


def mixed_obs(service_limits: Sequence[float], service_classes: str = "S",
              job_lists: Sequence[int] = (NL, CL), job_growth: Sequence[float] = (1.0, 0.1),
              service_usage: Sequence[float] | None = None, job_usage: float = 0.2,
              ) -> Observation:
    """Services first (their target 1 s and a latency that puts them in the class given
    by a letter), then training jobs."""
    latency = {"G": 0.5, "S": 1.0, "B": 2.0}
    ns, nj = len(service_limits), len(job_lists)
    usage = list(service_limits if service_usage is None else service_usage) + [job_usage] * nj
    return jobs(
        [IDLE] * ns + list(job_lists), [NAN] * ns + list(job_growth), usage=usage,
        training=[False] * ns + [True] * nj, target=[1.0] * ns + [NAN] * nj,
        measured=[latency[c] for c in service_classes] + [NAN] * nj,
        limit=list(service_limits) + [NAN] * nj)


def test_only_services_is_the_inference_policy_alone() -> None:
    pol, alone = make_policy("dqoes"), DQoES()
    obs = mixed_obs([0.3, 0.6], "GB", job_lists=(), job_growth=())
    pol.resize(2)
    alone.resize(2)
    d, a = pol.decide(obs, 0.0), alone.decide(obs, 0.0)
    assert d is not None and a is not None and pol.name == "dqoes"
    assert d.limits.tolist() == a.limits.tolist() and d.classes.tolist() == a.classes.tolist()


def test_only_training_jobs_is_flowcon_alone() -> None:
    pol = make_policy("dqoes")
    pol.resize(2)
    d = pol.decide(jobs([CL, IDLE], [0.01, NAN], training=[True, True]), 0.0)
    assert d is not None and pol.name == "flowcon" and d.limits.tolist() == [0.25, 1.0]


def test_only_the_admit_policy_asks_for_pressure_and_only_its_services() -> None:
    # Both slow (B) and well under their caps. (A fast one would be admitted at its need,
    # under its use: at its cap, its pressure tells nothing, so it is not asked for.)
    obs = mixed_obs([0.3, 0.6], "BB", service_usage=[0.1, 0.1])
    for name, services in (("dqoes", [False, False]), ("admit", [True, True])):
        pol = make_policy(name)
        pol.resize(4)
        d = pol.decide(obs, 0.0)
        assert d is not None and d.pressure is not None
        assert d.pressure.tolist() == [*services, False, False]
    d = one_round(jobs([NL, CL], [1.0, 0.1]))
    assert d.pressure is not None and not d.pressure.any()


def test_training_uses_what_the_services_leave() -> None:
    pol = make_policy("dqoes")
    pol.resize(4)
    d = pol.decide(mixed_obs([0.3, 0.2], "SS"), 0.0)  # services in S keep 0.5 in all
    assert d is not None and pol.name == "dqoes+flowcon"
    assert d.classes.tolist() == [S, S, NL, CL]
    assert d.limits[:2].tolist() == [0.3, 0.2]
    # B = 0.5; floors 1/8 each, the rest (0.25) to the NL job: caps 0.375 and 0.125
    assert d.totals["training_budget"] == pytest.approx(0.5)
    assert d.limits[2:] == pytest.approx([0.375, 0.125])


def test_services_decide_as_if_training_cpu_were_busy() -> None:
    """The inference policy sees the jobs as slots without a target, their CPU used: its
    limits are the same as alone on that observation."""
    pol, alone = make_policy("dqoes"), DQoES()
    obs = mixed_obs([0.3, 0.3], "GB", service_usage=[0.3, 0.3])
    pol.resize(4)
    alone.resize(4)
    d, a = pol.decide(obs, 0.0), alone.decide(obs, 0.0)
    assert d is not None and a is not None
    assert d.limits[:2].tolist() == a.limits[:2].tolist()
    assert d.classes[:2].tolist() == [G, B]


def test_training_keeps_its_guarantee_whatever_the_services_hold() -> None:
    pol = make_policy("dqoes")
    pol.resize(4)
    d = pol.decide(mixed_obs([0.9, 0.9], "SS"), 0.0)
    assert d is not None
    # g_T = 2 / (2·4) = 0.25: each job its floor 1/8, nothing more
    assert d.totals["training_budget"] == pytest.approx(0.25)
    assert d.limits[2:] == pytest.approx([0.125, 0.125])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.01, 1.0), min_size=1, max_size=6),
       st.lists(st.sampled_from([NL, WL, CL, IDLE]), min_size=1, max_size=6),
       st.lists(st.floats(0.0, 5.0), min_size=6, max_size=6))
def test_neither_kind_starves(service_limits: list[float], lists: list[int],
                              growth: list[float]) -> None:
    """Every job's cap is at least 1/(2n); the jobs' caps add up to at most what the
    services' limits leave, or to the guarantee n_T/(2n) when they leave less."""
    pol = make_policy("dqoes")
    n, ns, nj = len(service_limits) + len(lists), len(service_limits), len(lists)
    pol.resize(n)
    d = pol.decide(mixed_obs(service_limits, "S" * ns, lists, growth[:nj]), 0.0)
    assert d is not None
    training = d.limits[ns:]
    assert (training >= 1.0 / (2 * n) - 1e-12).all()
    leave = max(1.0 - sum(d.limits[:ns]), nj / (2 * n))
    assert training.sum() <= leave + 1e-9


def _give_way_round(pol: Mixed, obs: Observation, now: float) -> float:
    pol.reset()
    assert pol.decide(obs, now) is not None
    return pol.ceiling


def test_training_gives_way_to_a_service_that_lacks_cpu() -> None:
    pol = make_policy("dqoes", None)
    assert isinstance(pol, Mixed)
    pol.resize(4)
    # A service in B at its limit, none in G: training gives up β = 10% of what it used.
    lacking = mixed_obs([0.3, 0.2], "SB", job_usage=0.25)
    assert _give_way_round(pol, lacking, 0.0) == pytest.approx(0.9 * 0.5)
    assert _give_way_round(pol, lacking, 1.0) == pytest.approx(0.9 * 0.45)  # and again
    # ... down to the guarantee, 2/8
    for k in range(30):
        _give_way_round(pol, lacking, 2.0 + k)
    assert pol.ceiling == pytest.approx(0.25)
    # A service in B that does not use its limit lacks something else than CPU.
    idle_b = mixed_obs([0.3, 0.2], "SB", service_usage=[0.3, 0.1], job_usage=0.25)
    assert _give_way_round(pol, idle_b, 40.0) == 1.0  # no ceiling any more


def test_training_does_not_give_way_while_a_service_has_cpu_to_give() -> None:
    pol = make_policy("dqoes", None)
    assert isinstance(pol, Mixed)
    pol.resize(4)
    _give_way_round(pol, mixed_obs([0.3, 0.2], "SB", job_usage=0.25), 0.0)
    before = pol.ceiling
    assert _give_way_round(pol, mixed_obs([0.3, 0.2], "GB", job_usage=0.25), 1.0) == before


def test_the_jobs_run_at_every_round_the_services_when_their_listener_says() -> None:
    pol = make_policy("dqoes")
    pol.resize(4)
    obs = mixed_obs([0.3, 0.2], "SS")
    first = pol.decide(obs, 0.0)
    assert first is not None
    services = first.limits[:2].copy()
    assert isinstance(pol, Mixed)
    pol.training.reset()  # FlowCon due, DQoES not
    d = pol.decide(mixed_obs([0.3, 0.2], "GG"), 1.0)
    assert d is not None
    assert np.isnan(d.limits[:2]).all()  # the services' limits are left alone
    assert d.classes[:2].tolist() == [S, S]  # and their classes are the last round's
    assert np.isfinite(d.limits[2:]).all() and services.tolist() == [0.3, 0.2]


def test_both_kinds_decide_without_allocating_arrays() -> None:
    n = 20000
    rng = np.random.default_rng(2)
    half = n // 2
    obs = mixed_obs(rng.uniform(0.0, 1e-4, half), "".join(rng.choice(list("GSB"), half)),
                    rng.choice([NL, WL, CL], n - half), rng.uniform(0.0, 2.0, n - half))
    pol = make_policy("dqoes")
    pol.resize(n)
    assert_decides_without_allocating(pol, obs)
