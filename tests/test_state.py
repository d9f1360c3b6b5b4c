"""The state store: every acknowledged change survives a crash at any point, a torn or
corrupt file loses nothing acknowledged, and a full filesystem fails cleanly (the last on
a real tmpfs in the guest)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dqoes_cg.membership.objective import Target
from dqoes_cg.state import COMPACT_MIN_LINES, StateError, StateStore


def _t(name: str, target_s: float = 0.1, **kw: object) -> Target:
    return Target(name, target_s, "p95", **kw)  # type: ignore[arg-type]


def test_changes_are_appended_and_replayed(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    assert store.load() == {}
    store.put(_t("a"), _t("b"))
    store.put(_t("a", 0.2, cgroup="/sys/fs/cgroup/x", original_max="max 100000"))
    store.delete("b")
    store.close()
    loaded = StateStore(tmp_path).load()
    assert list(loaded) == ["a"]
    assert (loaded["a"].target_s, loaded["a"].original_max) == (0.2, "max 100000")
    # Loading compacted it: a snapshot, an empty log, the previous snapshot kept.
    assert (tmp_path / "state.log").read_bytes() == b""
    assert json.loads((tmp_path / "state.json").read_text())["targets"][0]["name"] == "a"


def test_a_torn_last_line_is_ignored_and_a_bad_middle_line_stops_the_replay(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = StateStore(tmp_path)
    store.load()
    store.put(_t("a"))
    store.close()
    with open(tmp_path / "state.log", "ab") as f:
        f.write(b'{"put": {"name": "b", "target_s": 0.1, "me')  # a crash mid-append
    assert list(StateStore(tmp_path).load()) == ["a"]
    assert "unreadable" not in caplog.text
    with open(tmp_path / "state.log", "ab") as f:
        f.write(b'garbage\n{"put": {"name": "c", "target_s": 0.1, "metric": "p95"}}\n')
    assert list(StateStore(tmp_path).load()) == ["a"]
    assert "line 1 unreadable" in caplog.text


def test_a_corrupt_snapshot_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.load()
    store.put(_t("a"))
    store.compact({"a": _t("a")})
    store.put(_t("b"))
    store.compact({"a": _t("a"), "b": _t("b")})
    store.close()
    (tmp_path / "state.json").write_bytes(b'{"version": 2, "targets": [{"na')
    assert list(StateStore(tmp_path).load()) == ["a"]  # state.json.prev
    assert list(tmp_path.glob("state.json.corrupt-*"))


def test_version_1_files_are_read(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(json.dumps({"version": 1, "targets": [
        {"name": "web", "target_s": 0.04, "metric": "p95", "cgroup": "/sys/fs/cgroup/w",
         "original_max": "max 100000"}]}))
    t = StateStore(tmp_path).load()["web"]
    assert (t.cgroup, t.original_max, t.source, t.cgroup_id) == (
        "/sys/fs/cgroup/w", "max 100000", "cli", None)


def test_the_log_is_compacted_as_it_grows(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.load()
    for i in range(COMPACT_MIN_LINES + 10):
        store.put(_t(f"c{i}"))
    assert store.due_for_compaction(1)
    store.compact({f"c{i}": _t(f"c{i}") for i in range(COMPACT_MIN_LINES + 10)})
    assert not store.due_for_compaction(1)
    assert len(StateStore(tmp_path).load()) == COMPACT_MIN_LINES + 10


# --- a full filesystem, for real ------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs, filled up to its last page by a file that `free` can release."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                   check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(mount: Path, leave: int) -> Path:
    """Fill the filesystem but `leave` bytes (rounded to pages)."""
    filler = mount / "filler"
    st = os.statvfs(mount)
    size = st.f_bavail * st.f_frsize - leave
    with open(filler, "wb") as f:
        f.write(b"\0" * max(size, 0))
    return filler


@pytest.mark.kernel
def test_a_full_disk_fails_cleanly_and_loses_nothing_acknowledged(small_fs: Path) -> None:
    state = small_fs / "state"
    store = StateStore(state)
    store.load()
    acknowledged = {}
    for i in range(20):
        t = _t(f"container-{i:02d}-" + "x" * 200)
        store.put(t)
        acknowledged[t.name] = t
    store.compact(acknowledged)
    filler = _fill(small_fs, 4096)  # one page left
    refused = 0
    for i in range(20, 80):
        t = _t(f"container-{i:02d}-" + "x" * 200)
        try:
            store.put(t)
            acknowledged[t.name] = t
        except StateError as e:
            assert "No space left on device" in str(e)
            refused += 1
    assert refused  # the page ran out
    store.compact(acknowledged)  # fails quietly: the log keeps the state
    store.close()
    assert sorted(StateStore(state).load()) == sorted(acknowledged)
    assert not [p for p in state.iterdir() if p.name.startswith(".state")]  # no leftovers
    filler.unlink()


def test_original_weights_are_kept(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.load()
    store.put(_t("a", cgroup="/sys/fs/cgroup/x", original_max="max 100000", original_weight=300))
    store.close()
    assert StateStore(tmp_path).load()["a"].original_weight == 300


@pytest.mark.parametrize("bad", [0, 10_001, "100", 1.5, True])
def test_a_weight_out_of_cpu_weight_s_range_is_refused(tmp_path: Path, bad: object) -> None:
    (tmp_path / "state.json").write_text(json.dumps({"version": 4, "targets": [
        {"name": "a", "target_s": 0.1, "metric": "p95", "original_weight": bad}]}))
    assert StateStore(tmp_path).load() == {}
    assert list(tmp_path.glob("state.json.corrupt-*"))


def test_where_latencies_are_scraped_from_is_kept(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.load()
    store.put(_t("a", metrics=":8000/metrics", histogram="request_latency_seconds"))
    store.close()
    a = StateStore(tmp_path).load()["a"]
    assert (a.scrape.port, a.scrape.path, a.scrape.histogram) == (
        8000, "/metrics", "request_latency_seconds")


@pytest.mark.parametrize(("metrics", "histogram"), [
    (":8000/metrics", None), ("8000", "h"), (":8000/metrics", "not a name")])
def test_a_malformed_scrape_is_refused(tmp_path: Path, metrics: object,
                                       histogram: object) -> None:
    (tmp_path / "state.json").write_text(json.dumps({"version": 5, "targets": [
        {"name": "a", "target_s": 0.1, "metric": "p95", "metrics": metrics,
         "histogram": histogram}]}))
    assert StateStore(tmp_path).load() == {}
    assert list(tmp_path.glob("state.json.corrupt-*"))
