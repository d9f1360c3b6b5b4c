"""A drain looks up a ring's path only when its file reported a change (inotify), and finds
every replacement, truncation or growth at the next drain all the same: for rings sharing a
directory, adopted by a new set, in a directory that moved, changed through another link,
after a lost event, or without a watch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dqoes_cg.ring import RingSet, Status, create_ring, ring_path
from tests.ringfile import HEADER, SLOT

CAPACITY = 64
SIZE = HEADER + CAPACITY * SLOT


@pytest.mark.parametrize("adopted", [False, True])
def test_a_healthy_ring_is_not_looked_up_at_every_drain(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, adopted: bool) -> None:
    """A relative path names another file once the daemon changes directory: what the
    drain looks up shows when it does."""
    monkeypatch.chdir(tmp_path)
    path = ring_path(Path("."), "web")
    create_ring(path, CAPACITY)
    rings = RingSet([path], CAPACITY, recreate=False)
    rings.drain()  # the first drain after attaching looks the path up
    if adopted:
        rings = RingSet([path], CAPACITY, recreate=False, adopt=rings)
        rings.drain()  # and so does the first one after adopting
    monkeypatch.chdir(tmp_path.parent)
    for _ in range(3):
        rings.drain()
        assert rings.status[0] == Status.OK
    (tmp_path / path.parent / "junk").touch()  # what a container does beside it: no matter
    rings.drain()
    assert rings.status[0] == Status.OK
    os.chmod(tmp_path / path, 0o666)  # a change to its file
    rings.drain()
    assert rings.status[0] == Status.MISSING
    rings.close()


def test_rings_sharing_a_directory_are_each_watched(tmp_path: Path) -> None:
    """One watch serves both rings, and the other one watches again when the first one
    is closed (which removes the watch)."""
    a, b = tmp_path / "a", tmp_path / "b"
    for path in (a, b):
        create_ring(path, CAPACITY)
    with RingSet([a, b], CAPACITY, recreate_interval=0) as rings:
        rings.drain()
        create_ring(a, CAPACITY)
        rings.drain()  # closes a, then re-opens the new ring there
        assert rings.last_fault.tolist() == [Status.REPLACED, 0]
        assert rings.status.tolist() == [Status.OK, Status.OK]
        create_ring(b, CAPACITY)
        rings.drain()
        create_ring(a, CAPACITY)
        rings.drain()
        assert rings.faults.tolist() == [2, 1]
        assert rings.last_fault.tolist() == [Status.REPLACED] * 2


def test_an_adopted_ring_is_watched_by_its_new_set(tmp_path: Path) -> None:
    path = ring_path(tmp_path, "web")
    first = RingSet([path], CAPACITY, recreate_interval=0)
    first.drain()
    second = RingSet([path], CAPACITY, recreate_interval=0, adopt=first)
    second.drain()
    create_ring(path, CAPACITY)
    second.drain()
    assert second.faults[0] == 1 and second.last_fault[0] == Status.REPLACED
    third = RingSet([path], CAPACITY, adopt=second)
    create_ring(path, CAPACITY)  # before the new set ever drained
    third.drain()
    assert third.faults[0] == 2
    third.close()


def test_a_ring_in_a_directory_that_moved_is_watched_there(tmp_path: Path) -> None:
    """The path now goes through another directory, to the same file (a hard link): the
    drain watches the new directory."""
    path = ring_path(tmp_path, "web")
    old = tmp_path / "old"
    create_ring(path, CAPACITY)
    with RingSet([path], CAPACITY, recreate=False) as rings:
        rings.drain()
        path.parent.rename(old)
        path.parent.mkdir()
        os.link(old / path.name, path)
        rings.drain()
        assert rings.status[0] == Status.OK
        create_ring(path, CAPACITY)
        rings.drain()
        assert rings.status[0] == Status.REPLACED


@pytest.mark.parametrize("size", [0, SIZE - 1, SIZE + 1])
def test_a_ring_changed_through_another_link_is_looked_up(tmp_path: Path, size: int) -> None:
    """A hard link in a subdirectory of the ring's: its events are the file's all the same."""
    path = ring_path(tmp_path, "web")
    create_ring(path, CAPACITY)
    (path.parent / "sub").mkdir()
    os.link(path, path.parent / "sub" / "alias")
    with RingSet([path], CAPACITY, recreate=False) as rings:
        rings.drain()
        os.truncate(path.parent / "sub" / "alias", size)
        rings.drain()
        assert rings.status[0] == Status.BAD_SIZE


def test_a_ring_reached_through_a_symlinked_directory_is_looked_up_at_every_drain(
        tmp_path: Path) -> None:
    """Its directory is not watched (a watch would stay on the symlink's old target)."""
    for name in ("one", "two"):
        create_ring(tmp_path / name / "ring", CAPACITY)
    link = tmp_path / "link"
    link.symlink_to("one")
    with RingSet([link / "ring"], CAPACITY, recreate=False) as rings:
        rings.drain()
        (tmp_path / "new").symlink_to("two")
        (tmp_path / "new").replace(link)
        rings.drain()
        assert rings.status[0] == Status.REPLACED


def test_a_lost_event_still_has_the_ring_checked(tmp_path: Path) -> None:
    """A container that floods its ring with events overflows the queue: the next drain
    looks up every ring, and finds the replacement whose events were dropped."""
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    if limit > 100_000:
        pytest.skip(f"max_queued_events is {limit}: too slow to overflow")
    noisy, quiet = ring_path(tmp_path, "noisy"), ring_path(tmp_path, "quiet")
    for path in (noisy, quiet):
        create_ring(path, CAPACITY)
    with RingSet([noisy, quiet], CAPACITY, recreate=False) as rings:
        rings.drain()
        fd = os.open(noisy, os.O_WRONLY)
        for _ in range(limit // 2 + 1):  # two kinds of event in turn: none merges
            os.chmod(noisy, 0o666)
            os.pwrite(fd, bytes(8), 32)  # reserved header bytes, zero
        os.close(fd)
        create_ring(quiet, CAPACITY)
        rings.drain()
        assert rings.status.tolist() == [Status.OK, Status.REPLACED]


def test_changes_in_many_directories_at_once_are_all_found(tmp_path: Path) -> None:
    """More rings than one drain tells apart (64): it looks up every ring."""
    paths = [ring_path(tmp_path, f"c{i}") for i in range(71)]
    for path in paths:
        create_ring(path, CAPACITY)
    with RingSet(paths, CAPACITY, recreate=False) as rings:
        rings.drain()
        for path in paths[:70]:
            create_ring(path, CAPACITY)
        rings.drain()
        assert rings.status.tolist() == [Status.REPLACED] * 70 + [Status.OK]


def _watches() -> int:
    """The inotify watches this process holds, in all its instances."""
    fds = Path("/proc/self/fd")
    count = 0
    for fd in os.listdir(fds):
        try:
            if os.readlink(fds / fd) == "anon_inode:inotify":
                count += (Path("/proc/self/fdinfo") / fd).read_text().count("inotify wd:")
        except OSError:  # closed meanwhile (listdir's own descriptor)
            pass
    return count


def test_a_new_set_takes_over_the_watches_of_the_rings_it_adopts(tmp_path: Path) -> None:
    """And its predecessor's inotify instance, where removing each watch and adding it again,
    and closing the old instance, took a rebuild of 2,000 rings 0.2 s on a loaded host; the
    rings it does not adopt leave no watch behind."""
    paths = [ring_path(tmp_path, name) for name in ("a", "b", "c")]
    before = _watches()
    first = RingSet(paths, CAPACITY)
    first.drain()
    assert _watches() == before + 3
    second = RingSet(paths[:2], CAPACITY, adopt=first)
    assert _watches() == before + 2  # before it ever drained
    second.drain()
    assert _watches() == before + 2
    second.close()
    assert _watches() == before
