"""CgroupTable: cpu.stat parsing, apply and read-back through the C path.

Fake-tree tests check parsing and bookkeeping on plain files; the `kernel` tests check the
same operations against real cgroup v2 directories with busy processes in them.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dqoes_cg import cgtable
from dqoes_cg.cgtable import (
    FDS_PER_CGROUP,
    LEAVE_ALONE,
    PERIOD_UNKNOWN,
    CgroupTable,
    Status,
    raise_fd_limit,
)
from lab.fakecg import CPU_STAT, make_cgroup, write

U64_MAX = 2**64 - 1


def sample_one(mount: Path, cpu_stat: str | bytes) -> tuple[int, list[int]]:
    make_cgroup(mount, "c", cpu_stat=cpu_stat)
    with CgroupTable([mount / "c"]) as t:
        t.sample()
        counters = [t.usage_usec, t.throttled_usec, t.nr_periods, t.nr_throttled]
        return int(t.status[0]), [int(a[0]) for a in counters]


# --- cpu.stat parsing (fake tree) -----------------------------------------------------


def test_sample_reads_the_four_counters(tmp_path: Path) -> None:
    assert sample_one(tmp_path, CPU_STAT) == (Status.OK, [1000, 300, 10, 2])


@pytest.mark.parametrize("content", [
    "nr_throttled 4\nthrottled_usec 3\nnr_periods 2\nusage_usec 1\n",
    "x 9\nusage_usec 1\nfuture_key 18446744073709551615\nthrottled_usec 3\n"
    "nr_periods 2\nweird.key-name 0\nnr_throttled 4\n",
    "usage_usec 1\nthrottled_usec 3\nnr_periods 2\nnr_throttled 4",  # no final newline
    "usage_usec 1\nthrottled_usec 3\nnr_periods 2\nnr_throttled 4\nodd value 12a -\n",
], ids=["reordered", "unknown-keys", "no-final-newline", "unknown-key-free-form"])
def test_sample_tolerates_key_order_and_unknown_keys(tmp_path: Path, content: str) -> None:
    assert sample_one(tmp_path, content) == (Status.OK, [1, 3, 2, 4])


def test_sample_takes_the_largest_u64(tmp_path: Path) -> None:
    content = (f"usage_usec {U64_MAX}\nthrottled_usec 0\nnr_periods {U64_MAX}\n"
               "nr_throttled 0\n")
    assert sample_one(tmp_path, content) == (Status.OK, [U64_MAX, 0, U64_MAX, 0])


GOOD_REST = "throttled_usec 3\nnr_periods 2\nnr_throttled 4\n"


@pytest.mark.parametrize("content", [
    "",
    "\n",
    GOOD_REST,  # usage_usec missing
    "usage_usec 1\nthrottled_usec 3\nnr_periods 2\n",  # nr_throttled missing
    f"usage_usec {U64_MAX + 1}\n" + GOOD_REST,
    f"usage_usec {10**30}\n" + GOOD_REST,
    "usage_usec -1\n" + GOOD_REST,
    "usage_usec 12a\n" + GOOD_REST,
    "usage_usec 1.5\n" + GOOD_REST,
    "usage_usec \n" + GOOD_REST,
    "usage_usec  1\n" + GOOD_REST,
    "usage_usec 1 \n" + GOOD_REST,
    "usage_usec\n" + GOOD_REST,
    "usage_usec 1\nusage_usec 2\n" + GOOD_REST,  # duplicate
    "usage_usec 1\n\n" + GOOD_REST,  # an empty line
    "usage_usec 1\n" + GOOD_REST + "x" * 5000 + " 1\n",  # larger than the read buffer
    b"usage_usec 1\x00\n" + GOOD_REST.encode(),
])
def test_sample_reports_malformed_content(tmp_path: Path, content: str | bytes) -> None:
    status, _ = sample_one(tmp_path, content)
    assert status == Status.MALFORMED


def reference_parse(data: bytes) -> list[int] | None:
    """The cpu.stat grammar the C parser implements, written plainly."""
    keys = ["usage_usec", "throttled_usec", "nr_periods", "nr_throttled"]
    found: dict[str, int] = {}
    for line in data.split(b"\n")[: -1 if data.endswith(b"\n") else None]:
        key, space, value = line.partition(b" ")
        if not space:
            return None
        name = key.decode("latin-1")
        if name in keys:
            if name in found or not value.isdigit() or int(value) > U64_MAX:
                return None
            found[name] = int(value)
    return [found[k] for k in keys] if len(found) == len(keys) else None


KEYS = st.sampled_from(["usage_usec", "throttled_usec", "nr_periods", "nr_throttled",
                        "user_usec", "usage", "usage_usec2", ""])
VALUES = st.one_of(st.integers(0, 2**66).map(str), st.sampled_from(["", "-1", "1x", " 1"]))
LINES = st.lists(st.tuples(KEYS, VALUES).map(" ".join), max_size=10).map("\n".join)


@settings(max_examples=300, deadline=None)
@given(st.one_of(LINES.map(str.encode), st.binary(max_size=300)))
def test_sample_agrees_with_the_reference_parser(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        status, values = sample_one(Path(tmp), data)
    expected = reference_parse(data)
    if expected is None:
        assert status == Status.MALFORMED
    else:
        assert (status, values) == (Status.OK, expected)


# --- per-slot failures (fake tree) ----------------------------------------------------


def test_a_bad_slot_does_not_fail_the_batch(tmp_path: Path) -> None:
    good = make_cgroup(tmp_path, "good")
    bad = make_cgroup(tmp_path, "bad", cpu_stat="garbage\n")
    missing = tmp_path / "missing"
    no_max = make_cgroup(tmp_path, "no-max")
    (no_max / "cpu.max").unlink()
    with CgroupTable([good, bad, missing, no_max]) as t:
        assert t.sample() == 2
        assert list(t.status) == [Status.OK, Status.MALFORMED, Status.GONE, Status.OK]
        assert t.apply(50_000, 100_000) == 2
        assert list(t.apply_status) == [Status.OK, Status.OK, Status.GONE, Status.GONE]
        assert t.error(1) == "ok"  # apply succeeded there since the malformed sample
        t.sample()
        assert t.error(1) == "malformed content"
        assert t.error(2) == os.strerror(2)


def test_a_failed_slot_keeps_its_previous_counters(tmp_path: Path) -> None:
    c = make_cgroup(tmp_path, "c")
    with CgroupTable([c]) as t:
        t.sample()
        write(c / "cpu.stat", "usage_usec oops\n")
        t.sample()
        assert (t.status[0], t.usage_usec[0]) == (Status.MALFORMED, 1000)


def test_symlinks_are_never_followed(tmp_path: Path) -> None:
    real = make_cgroup(tmp_path, "real")
    linked_file = make_cgroup(tmp_path, "linked-file")
    (linked_file / "cpu.stat").unlink()
    (linked_file / "cpu.stat").symlink_to(real / "cpu.stat")
    (tmp_path / "linked-dir").symlink_to(real)
    (tmp_path / "parent-link").symlink_to(tmp_path)
    dirs = [linked_file, tmp_path / "linked-dir", tmp_path / "parent-link" / "real"]
    with CgroupTable(dirs) as t:
        assert t.sample() == 0
        assert list(t.status) == [Status.ERROR] * 3
        assert {t.error(i) for i in range(3)} == {os.strerror(40)}  # ELOOP


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    c = make_cgroup(tmp_path, "c")
    (c / "cpu.stat").unlink()
    os.mkfifo(c / "cpu.stat")
    with CgroupTable([c]) as t:
        assert t.sample() == 0
        assert t.status[0] == Status.ERROR


# --- apply and read-back bookkeeping (fake tree) --------------------------------------


def check_apply_writes_only_changed_slots(dirs: list[Path]) -> None:
    """The same scenario on a fake tree and on real cgroups."""
    with CgroupTable(dirs) as t:
        assert t.apply(np.array([20_000, 30_000, -1]), 100_000) == 3
        assert [(d / "cpu.max").read_text() for d in dirs] == [
            "20000 100000\n", "30000 100000\n", "max 100000\n"]
        assert t.apply() == 0
        t.quota_usec[1] = 40_000
        assert t.apply() == 1
        assert (dirs[1] / "cpu.max").read_text() == "40000 100000\n"
        assert list(t.last_quota_usec) == [20_000, 40_000, -1]
        assert list(t.apply_status) == [Status.OK] * 3
        assert t.read_back() == 0
        assert list(t.max_quota_usec) == [20_000, 40_000, -1]
        assert list(t.max_period_usec) == [100_000] * 3


def test_apply_writes_only_changed_slots(tmp_path: Path) -> None:
    check_apply_writes_only_changed_slots([make_cgroup(tmp_path, f"c{i}") for i in range(3)])


def test_any_negative_quota_is_max_and_a_bad_period_is_refused(tmp_path: Path) -> None:
    c = make_cgroup(tmp_path, "c", cpu_max="")
    with CgroupTable([c]) as t:
        assert t.apply(-1, 100_000) == 1
        assert t.apply(-7, 100_000) == 0
        assert t.apply(-1, -100_000) == 0
        assert (t.apply_status[0], t.error(0)) == (Status.ERROR, os.strerror(22))
        assert (c / "cpu.max").read_text() == "max 100000\n"


I64_MAX = 2**63 - 1


def test_apply_writes_every_value_in_full(tmp_path: Path) -> None:
    quotas, periods = [0, 1, 9, 10, I64_MAX, -1, -I64_MAX], [1, 10, 99, 100_000, I64_MAX, 7, 1]
    # empty files: a plain file keeps what lies beyond a shorter write, cpu.max would not
    dirs = [make_cgroup(tmp_path, f"c{i}", cpu_max="") for i in range(len(quotas))]
    with CgroupTable(dirs) as t:
        assert t.apply(np.array(quotas), np.array(periods)) == len(dirs)
        assert [(d / "cpu.max").read_text() for d in dirs] == [
            f"{'max' if q < 0 else q} {p}\n" for q, p in zip(quotas, periods, strict=True)]


def test_a_period_of_zero_leaves_the_slot_alone(tmp_path: Path) -> None:
    dirs = [make_cgroup(tmp_path, f"c{i}", cpu_max="") for i in range(2)]
    with CgroupTable(dirs) as t:
        t.apply_status[0] = Status.GONE  # a status from an earlier call, kept as it is
        assert t.apply(20_000, np.array([LEAVE_ALONE, 100_000])) == 1
        assert [(d / "cpu.max").read_text() for d in dirs] == ["", "20000 100000\n"]
        assert list(t.apply_status) == [Status.GONE, Status.OK]
        assert t.last_period_usec[0] == PERIOD_UNKNOWN


def test_apply_refuses_float_requests(tmp_path: Path) -> None:
    with CgroupTable([make_cgroup(tmp_path, "c")]) as t, pytest.raises(TypeError):
        t.apply(np.array([1.5]))


@pytest.mark.parametrize(("content", "expected"), [
    ("max 100000\n", (-1, 100_000)),
    ("50000 100000\n", (50_000, 100_000)),
    ("1000 1000", (1000, 1000)),
    ("max 100000\nleftover\n", (-1, 100_000)),  # only the kernel's single line counts
])
def test_read_back_parses_cpu_max(tmp_path: Path, content: str,
                                  expected: tuple[int, int]) -> None:
    with CgroupTable([make_cgroup(tmp_path, "c", cpu_max=content)]) as t:
        assert t.read_back() == 0
        assert t.read_back_status[0] == Status.OK
        assert (t.max_quota_usec[0], t.max_period_usec[0]) == expected


@pytest.mark.parametrize("content", [
    "", "max\n", "max  100000\n", "maxi 100000\n", "max 0\n", "max -1\n", " 1 2\n",
    f"{2**63} 100000\n", f"1 {2**63}\n", "1 2 3\n", "max 100000" + " " * 100,
])
def test_read_back_reports_malformed_cpu_max(tmp_path: Path, content: str) -> None:
    with CgroupTable([make_cgroup(tmp_path, "c", cpu_max=content)]) as t:
        t.read_back()
        assert t.read_back_status[0] == Status.MALFORMED


def test_read_back_flags_drift_and_invalidate_forces_a_rewrite(tmp_path: Path) -> None:
    dirs = [make_cgroup(tmp_path, f"c{i}") for i in range(3)]
    with CgroupTable(dirs) as t:
        assert t.read_back() == 0  # nothing written yet: nothing can drift
        t.apply(np.array([20_000, 30_000, 40_000]), 100_000)
        assert t.read_back() == 0
        write(dirs[1] / "cpu.max", "max 100000\n")
        write(dirs[2] / "cpu.max", "40000 50000\n")
        assert t.read_back() == 2
        assert list(t.drifted) == [False, True, True]
        assert t.apply() == 0
        t.invalidate(t.drifted)
        assert t.apply() == 2
        assert t.read_back() == 0
        t.invalidate()
        assert t.apply() == 3


# --- the wrapper ----------------------------------------------------------------------


class CountingLib:
    """Counts calls into the C library by function name."""

    def __init__(self, lib: object) -> None:
        self.lib, self.calls = lib, {}

    def __getattr__(self, name: str) -> object:
        target = getattr(self.lib, name)
        if not callable(target):
            return target

        def counted(*args: object) -> object:
            self.calls[name] = self.calls.get(name, 0) + 1
            return target(*args)
        return counted


def test_one_c_call_per_operation_for_a_thousand_cgroups(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    dirs = [make_cgroup(tmp_path, f"c{i}") for i in range(1000)]
    counting = CountingLib(cgtable.lib)
    monkeypatch.setattr(cgtable, "lib", counting)
    with CgroupTable(dirs) as t:
        assert t.sample() == 1000
        assert t.apply(np.arange(1000, dtype=np.int64) + 1000, 100_000) == 1000
        assert t.read_back() == 0
    assert counting.calls == {"dq_cgtable_open": 1, "dq_cgtable_sample": 1,
                              "dq_cgtable_apply": 1, "dq_cgtable_read_back": 1,
                              "dq_cgtable_close": 1}


def test_arrays_are_filled_in_place_never_rebound(tmp_path: Path) -> None:
    with CgroupTable([make_cgroup(tmp_path, "c")]) as t:
        usage = t.usage_usec
        t.sample()
        assert t.usage_usec is usage and usage[0] == 1000
        with pytest.raises(AttributeError):
            t.usage_usec = np.zeros(1, np.uint64)


def test_close_releases_every_descriptor(tmp_path: Path) -> None:
    dirs = [make_cgroup(tmp_path, f"c{i}") for i in range(10)]
    before = len(os.listdir("/proc/self/fd"))
    with CgroupTable(dirs) as t:
        assert len(os.listdir("/proc/self/fd")) == before + 10 * cgtable.FDS_PER_CGROUP
    assert len(os.listdir("/proc/self/fd")) == before
    with pytest.raises(ValueError, match="closed"):
        t.sample()
    t.close()


def test_an_empty_table_works() -> None:
    with CgroupTable([]) as t:
        assert (t.sample(), t.apply(), t.read_back()) == (0, 0, 0)


PRESSURE = ("some avg10=1.50 avg60=0.40 avg300=0.08 total={}\n"
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=7\n")


@pytest.mark.parametrize(("content", "status", "total"), [
    (PRESSURE.format(123456), Status.OK, 123456),
    ("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", Status.OK, 0),
    (PRESSURE.format(18446744073709551615), Status.OK, 18446744073709551615),
    (PRESSURE.format(18446744073709551616), Status.MALFORMED, None),  # one past u64
    (PRESSURE.format(-1), Status.MALFORMED, None),
    ("full avg10=0.00 avg60=0.00 avg300=0.00 total=7\n", Status.MALFORMED, None),
    ("some avg10=0.00 total=12 extra\n", Status.MALFORMED, None),
    ("some avg10=0.00\n", Status.MALFORMED, None),
    ("", Status.MALFORMED, None),
    ("x" * 4096, Status.MALFORMED, None),
    (None, Status.GONE, None),  # no pressure stall information: no file
], ids=["ok", "zero", "largest", "overflow", "negative", "no some line", "trailing",
        "no total", "empty", "too long", "absent"])
def test_pressure_reads_the_some_total(tmp_path: Path, content: str | None, status: Status,
                                       total: int | None) -> None:
    cg = make_cgroup(tmp_path, "a")
    if content is None:
        (cg / "cpu.pressure").unlink()
    else:
        write(cg / "cpu.pressure", content)
    with CgroupTable([cg]) as t:
        t.waited_usec[0] = 5
        assert t.pressure() == (status == Status.OK)
        assert t.pressure_status[0] == status
        assert int(t.waited_usec[0]) == (5 if total is None else total)
        assert t.status[0] == Status.ERROR and t.error(0) == "ok"  # the entry's own: untouched


def test_pressure_never_follows_a_symlink(tmp_path: Path) -> None:
    cg = make_cgroup(tmp_path, "a")
    (cg / "cpu.pressure").unlink()
    write(tmp_path / "elsewhere", PRESSURE.format(99))
    (cg / "cpu.pressure").symlink_to(tmp_path / "elsewhere")
    with CgroupTable([cg]) as t:
        assert t.pressure() == 0 and t.pressure_status[0] != Status.OK


def test_pressure_reads_only_the_slots_asked_for(tmp_path: Path) -> None:
    a, b, c = (make_cgroup(tmp_path, name) for name in "abc")
    write(a / "cpu.pressure", PRESSURE.format(11))
    write(b / "cpu.pressure", PRESSURE.format(22))
    (c / "cpu.pressure").unlink()  # no pressure stall information
    with CgroupTable([a, b, c]) as t:
        assert t.pressure_wanted.tolist() == [True] * 3  # every slot unless told otherwise
        assert t.pressure() == 2 and t.waited_usec[:2].tolist() == [11, 22]
        write(a / "cpu.pressure", PRESSURE.format(111))
        write(b / "cpu.pressure", "malformed")  # would be seen if it were read
        t.pressure_wanted[:] = [True, False, False]
        assert t.pressure() == 1
        # b not read: its last total kept; c has no file, which it says either way
        assert t.pressure_status.tolist() == [Status.OK, Status.SKIPPED, Status.GONE]
        assert t.waited_usec[:2].tolist() == [111, 22]
        t.pressure_wanted.fill(False)
        assert t.pressure() == 0
        assert t.pressure_status.tolist() == [Status.SKIPPED, Status.SKIPPED, Status.GONE]
        assert t.waited_usec[:2].tolist() == [111, 22]
        t.pressure_wanted[1] = True
        t.pressure()
        assert t.pressure_status.tolist() == [Status.SKIPPED, Status.MALFORMED, Status.GONE]
        with CgroupTable([b, a, tmp_path / "new"], adopt=t) as again:  # the request follows
            assert again.pressure_wanted.tolist() == [True, False, True]


# --- real cgroup v2 (kernel) ----------------------------------------------------------


def start_busy(cgroup: Path) -> subprocess.Popen:
    """A process spinning on one CPU, started inside `cgroup`."""
    script = f"echo $$ > {cgroup / 'cgroup.procs'} && exec sh -c 'while :; do :; done'"
    return subprocess.Popen(["sh", "-c", script], start_new_session=True)


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


@pytest.fixture
def busy() -> list[subprocess.Popen]:
    procs: list[subprocess.Popen] = []
    yield procs
    stop(procs)


def mkcgroups(root: Path, count: int) -> list[Path]:
    dirs = [root / f"c{i}" for i in range(count)]
    for d in dirs:
        d.mkdir()
    return dirs


def cpus_over(table: CgroupTable, seconds: float) -> float:
    """The CPUs slot 0 used over the next `seconds`."""
    assert table.sample() == 1
    usage, start = int(table.usage_usec[0]), time.monotonic()
    time.sleep(seconds)
    assert table.sample() == 1
    return (int(table.usage_usec[0]) - usage) / 1e6 / (time.monotonic() - start)


@pytest.mark.kernel
def test_a_half_cpu_cap_holds(cgroup_root: Path, busy: list[subprocess.Popen]) -> None:
    [capped] = mkcgroups(cgroup_root, 1)
    with CgroupTable([capped]) as t:
        assert t.apply(50_000, 100_000) == 1
        busy.append(start_busy(capped))
        time.sleep(0.5)  # let it start spinning
        throttled = int(t.nr_throttled[0])
        # The cap must hold in every window. An emulated guest on a loaded host may lose
        # CPU time to other work, so up to three windows are given to reach the cap.
        windows = []
        while len(windows) < 3 and not any(c >= 0.45 for c in windows):
            windows.append(cpus_over(t, 2.0))
        assert max(windows) <= 0.55 and max(windows) >= 0.45, windows
        assert t.nr_throttled[0] > throttled and t.throttled_usec[0] > 0


@pytest.mark.kernel
def test_pressure_counts_the_time_a_task_waited_for_a_cpu(
        cgroup_root: Path, busy: list[subprocess.Popen]) -> None:
    crowded, alone = mkcgroups(cgroup_root, 2)
    with CgroupTable([crowded, alone]) as t:
        assert t.pressure() == 2, t.pressure_status
        start = t.waited_usec.copy()
        # More spinning tasks than CPUs: one of them always waits.
        for _ in range((os.cpu_count() or 1) + 1):
            busy.append(start_busy(crowded))
        deadline = time.monotonic() + 120
        while True:
            assert t.pressure() == 2, t.pressure_status
            waited = (t.waited_usec - start) / 1e6
            if waited[0] >= 1.0:
                break
            assert time.monotonic() < deadline, f"waited {waited} s in 120 s"
            time.sleep(0.2)
        assert waited[1] < 0.1 * waited[0], waited  # nothing of its own ran


@pytest.mark.kernel
def test_a_removed_cgroup_is_gone_and_the_others_still_ok(cgroup_root: Path) -> None:
    dirs = mkcgroups(cgroup_root, 3)
    with CgroupTable(dirs) as t:
        assert t.sample() == 3
        dirs[1].rmdir()
        assert t.sample() == 2
        assert list(t.status) == [Status.OK, Status.GONE, Status.OK]
        assert t.apply(30_000, 100_000) == 2
        assert list(t.apply_status) == [Status.OK, Status.GONE, Status.OK]
        assert t.read_back() == 0
        assert list(t.read_back_status) == [Status.OK, Status.GONE, Status.OK]
    with CgroupTable(dirs) as t:  # and when it was gone before the table opened
        t.sample()
        assert list(t.status) == [Status.OK, Status.GONE, Status.OK]


@pytest.mark.kernel
def test_apply_writes_only_changed_slots_on_real_cgroups(cgroup_root: Path) -> None:
    check_apply_writes_only_changed_slots(mkcgroups(cgroup_root, 3))


@pytest.mark.kernel
def test_read_back_detects_an_external_write(cgroup_root: Path) -> None:
    dirs = mkcgroups(cgroup_root, 2)
    with CgroupTable(dirs) as t:
        t.apply(np.array([20_000, 30_000]), 100_000)
        (dirs[1] / "cpu.max").write_text("max\n")  # as systemd's daemon-reload would
        assert t.read_back() == 1
        assert list(t.drifted) == [False, True]
        t.invalidate(t.drifted)
        assert t.apply() == 1
        assert (dirs[1] / "cpu.max").read_text() == "30000 100000\n"


@pytest.mark.kernel
def test_the_kernel_refusal_of_a_bad_quota_marks_only_that_slot(cgroup_root: Path) -> None:
    dirs = mkcgroups(cgroup_root, 2)
    with CgroupTable(dirs) as t:
        assert t.apply(np.array([10, 30_000]), 100_000) == 1  # below the 1 ms minimum
        assert list(t.apply_status) == [Status.ERROR, Status.OK]
        assert t.error(0) == os.strerror(22)


@pytest.mark.kernel
def test_a_thousand_cgroups_in_one_call_each(cgroup_root: Path) -> None:
    # 6,000 descriptors: past the guest's hard limit of 4,096, which root may lift (for this
    # test only: later ones and the daemons they start keep the limit they had)
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert raise_fd_limit(FDS_PER_CGROUP * 1000, hard=True) >= FDS_PER_CGROUP * 1000
    try:
        _a_thousand_cgroups(cgroup_root)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def _a_thousand_cgroups(cgroup_root: Path) -> None:
    dirs = mkcgroups(cgroup_root, 1000)
    with CgroupTable(dirs) as t:
        assert t.sample() == 1000
        assert t.apply(np.arange(1000, dtype=np.int64) + 1000, 100_000) == 1000
        assert t.read_back() == 0
        assert np.array_equal(t.max_quota_usec, np.arange(1000) + 1000)
