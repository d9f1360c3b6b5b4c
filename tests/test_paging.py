"""Status and list a page at a time (paging.py), and the view a tick's requests share
(issue 33): the pages of a status or a listing, put together, are the whole of it in the
order of the names, whatever comes and goes between two pages; a bad limit or cursor gets
a one-line error and changes nothing; the status of a tick is made once for all who ask.
Values and counted calls are compared, never times."""

from __future__ import annotations

import json
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from dqoes_cg import api, ctl
from dqoes_cg.cgroup import resolve_many
from dqoes_cg.config import Config
from dqoes_cg.control import Later, Peer, RequestError
from dqoes_cg.controller import Controller
from dqoes_cg.jsonline import Encoded
from dqoes_cg.membership.objective import Objective
from dqoes_cg.paging import DEFAULT_LIMIT, MAX_LIMIT, cursor_after
from dqoes_cg.status import CLASSES, Listing
from lab.fakecg import make_cgroup
from tests.operations import operations
from tests.test_controller import Host
from tests.test_ctl import Daemon

ROOT = Peer(1, 0, 0)


def _controller(host: Host, bound: int, pending: int) -> Controller:
    """`bound` targets with a cgroup and `pending` without, set in an order that is not
    their names' (the whole status keeps the order they were set in)."""
    cfg = Config(mount=host.mount, state_dir=host.tmp / "state", run_dir=host.tmp / "run",
                 cpus=2)
    c = Controller(cfg, policy=host.policy, threaded_binder=False,
                   resolve=lambda names: resolve_many(names, host.mount))
    for k in reversed(range(bound)):
        path = f"pods/c{k:04d}"
        make_cgroup(host.mount, path)
        c.set_target(path, Objective(0.1, "mean"), False)
    for k in reversed(range(pending)):
        c.set_target(f"absent-{k:04d}", Objective(0.1, "mean"), True)
    for _ in range(100):
        c.tick(time.monotonic())
        if len(c.fleet) == bound:
            return c
    raise AssertionError(f"{len(c.fleet)} of {bound} bound")


def _ask(c: Controller, op: str, **req: Any) -> Any:
    """The result of a request, made as the thread for replies makes it."""
    reply = api.handle(c, op, req, ROOT)
    result = reply.make() if isinstance(reply, Later) else reply
    return json.loads(result.text) if isinstance(result, Encoded) else result


def _pages(c: Controller, op: str, items: str, limit: int | None) -> tuple[list, list]:
    """Every page of `op`, one after the other: the items of each page, and the pages."""
    shown, pages, cursor = [], [], None
    while True:
        page = _ask(c, op, limit=limit, cursor=cursor)  # null: the default, the first
        pages.append(page)
        shown += page[items]
        cursor = page["next"]
        if cursor is None:
            return shown, pages


def _by_name(entries: list[dict]) -> list[dict]:
    return sorted(entries, key=lambda e: e["name"])


@pytest.mark.parametrize(("bound", "pending", "limit"), [
    (4, 6, 3), (4, 6, 1), (4, 6, None), (100, 900, 128), (100, 900, None)])
def test_the_pages_of_a_status_and_a_list_are_the_whole_of_it_by_name(
        tmp_path: Path, bound: int, pending: int, limit: int | None) -> None:
    c = _controller(Host(tmp_path), bound, pending)
    whole = _ask(c, "status")
    assert len(whole["containers"]) == bound + pending
    assert [e["name"] for e in whole["containers"]] == [t.name for t in c.targets]  # as set

    shown, pages = _pages(c, "status", "containers", limit)
    assert shown == _by_name(whole["containers"])
    page_size = limit or DEFAULT_LIMIT
    assert [len(p["containers"]) for p in pages[:-1]] == [page_size] * (len(pages) - 1)
    assert 0 < len(pages[-1]["containers"]) <= page_size
    for page in pages:  # the host's figures are of every target, on every page
        assert page["host"] == whole["host"]
    classes = Counter(e["class"] for e in whole["containers"])
    assert {k: whole["host"][k] for k in CLASSES} == {k: classes[k] for k in CLASSES}
    assert whole["host"]["pending"] == pending

    listed, _ = _pages(c, "list", "entries", limit)
    assert listed == _by_name(_ask(c, "list"))
    c.shutdown()


def test_an_entry_added_or_removed_between_pages_neither_repeats_nor_shifts_others(
        tmp_path: Path) -> None:
    host = Host(tmp_path)
    c = _controller(host, 4, 8)  # absent-0000 .. absent-0007, pods/c0000 .. pods/c0003
    first = _ask(c, "status", limit=5)
    assert [e["name"] for e in first["containers"]] == [f"absent-{k:04d}" for k in range(5)]
    c.set_target("absent-0002b", Objective(0.1, "mean"), True)  # before the cursor
    c.set_target("absent-0005b", Objective(0.1, "mean"), True)  # after it
    c.unset_target("absent-0001")  # shown already
    c.unset_target("absent-0006")  # not shown yet
    c.unset_target("absent-0004")  # the cursor's own
    c.tick(time.monotonic())
    rest, _ = _pages_from(c, first["next"], limit=2)
    assert [e["name"] for e in rest] == ["absent-0005", "absent-0005b", "absent-0007",
                                         "pods/c0000", "pods/c0001", "pods/c0002",
                                         "pods/c0003"]

    listed = _ask(c, "list", limit=5)
    c.unset_target(listed["entries"][-1]["name"])
    c.set_target("absent-0000a", Objective(0.1, "mean"), True)
    after = _ask(c, "list", limit=100, cursor=listed["next"])
    assert [e["name"] for e in listed["entries"] + after["entries"]] == [
        "absent-0000", "absent-0002", "absent-0002b", "absent-0003", "absent-0005",
        "absent-0005b", "absent-0007", "pods/c0000", "pods/c0001", "pods/c0002",
        "pods/c0003"]
    assert after["next"] is None
    c.shutdown()


def _pages_from(c: Controller, cursor: str, limit: int) -> tuple[list, int]:
    shown, count = [], 0
    while cursor is not None:
        page = _ask(c, "status", limit=limit, cursor=cursor)
        shown += page["containers"]
        cursor, count = page["next"], count + 1
    return shown, count


@pytest.mark.parametrize("req", [
    {"limit": 0}, {"limit": -1}, {"limit": MAX_LIMIT + 1}, {"limit": 10**100},
    {"limit": "5"}, {"limit": 2.0}, {"limit": True}, {"limit": None, "cursor": 5},
    {"cursor": ""}, {"cursor": "absent-0001"}, {"cursor": "n2:absent-0001"},
    {"cursor": ["n1:x"]}, {"cursor": "n1:" + "x" * 5000}, {"limit": 2, "cursor": {}},
    {"container": "absent-0001", "limit": 2}, {"container": "absent-0001", "cursor": "n1:"},
])
def test_a_bad_limit_or_cursor_gets_a_one_line_error_and_changes_nothing(
        tmp_path: Path, req: dict) -> None:
    c = _controller(Host(tmp_path), 2, 3)
    before = _ask(c, "status"), _ask(c, "list"), c.counters.ticks
    for op in ("status", "list"):
        if "container" in req and op == "list":
            continue
        with pytest.raises(RequestError) as e:
            _ask(c, op, **req)
        message = str(e.value)
        assert "\n" not in message and len(message) < 200
        assert ("limit" in message or "cursor" in message or "pages" in message), message
    assert (_ask(c, "status"), _ask(c, "list"), c.counters.ticks) == before
    c.shutdown()


def test_a_cursor_of_a_name_gone_or_never_there_goes_on_after_it(tmp_path: Path) -> None:
    """A cursor holds a name, not a position: whatever became of it, the page after holds
    the names after it."""
    c = _controller(Host(tmp_path), 2, 3)
    for name, after in [("absent-00015", ["absent-0002", "pods/c0000", "pods/c0001"]),
                        ("zzz", []), ("", sorted(t.name for t in c.targets))]:
        page = _ask(c, "status", cursor=cursor_after(name))
        assert [e["name"] for e in page["containers"]] == after
        assert page["next"] is None
    c.shutdown()


def test_the_requests_of_a_tick_share_one_view_and_one_status(tmp_path: Path) -> None:
    """The view is taken once a tick and the status made of it once, however many ask:
    the second status of a tick costs a small part of the first (counted calls), a page
    of it a part that does not grow with the targets; a tick, or a change a request makes,
    takes a new view."""
    c = _controller(Host(tmp_path), 50, 450)
    first = operations(lambda: _ask(c, "status"))
    again = operations(lambda: _ask(c, "status"))
    assert c.view() is c.view()
    assert again * 20 < first, (again, first)

    # Pages of one tick: what every page needs of the view (the order of the names, the
    # counts of the classes) is made once; each page then costs as much as its entries.
    _ask(c, "status", limit=10)
    page_ops = [operations(partial(_ask, c, "status", limit=10, cursor=cursor_after(name)))
                for name in ("absent-0100", "absent-0300")]
    assert page_ops[0] == page_ops[1] and page_ops[0] * 20 < first, (page_ops, first)

    before = c.view()
    c.tick(time.monotonic())
    assert c.view() is not before
    assert operations(lambda: _ask(c, "status")) * 2 > first  # made anew for the new tick
    taken = c.view()
    c.set_target("absent-new", Objective(0.1, "mean"), True)
    assert c.view() is not taken
    assert "absent-new" in [e["name"] for e in _ask(c, "status")["containers"]]
    c.shutdown()


def test_dqoesctl_shows_the_pages_put_together(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """dqoesctl asks a page at a time (here of 2) and shows what one whole reply showed,
    in the order of the names."""
    d = Daemon(tmp_path)
    names = ["pods/web", "pods/api", "pods/db"]
    for name in names:
        make_cgroup(d.mount, name)
    d.start()
    try:
        for name in names:
            ctl.main(["--socket", str(d.socket), "set-target", name, "40ms"])
        for k in (3, 1, 2):
            ctl.main(["--socket", str(d.socket), "set-target", f"absent-{k}", "40ms",
                      "--pending"])
        deadline = time.monotonic() + 30
        while ctl.request(d.socket, "status")["host"]["pending"] > 3:
            assert time.monotonic() < deadline, "not bound"
            time.sleep(0.05)
        capsys.readouterr()
        monkeypatch.setattr(ctl, "MAX_LIMIT", 2)
        whole = ctl.request(d.socket, "list")
        assert ctl.main(["--socket", str(d.socket), "list"]) == 0
        assert capsys.readouterr().out == ctl.format_list(
            [Listing.from_json(t) for t in _by_name(whole)]) + "\n"
        status = ctl._of_all(d.socket, "status", "containers")
        assert [c["name"] for c in status["containers"]] == sorted(
            [*names, "absent-1", "absent-2", "absent-3"])
        assert status["host"]["pending"] == 3 and "next" not in status
        assert ctl.main(["--socket", str(d.socket), "status"]) == 0
        shown = capsys.readouterr().out
        assert all(name in shown for name in names) and "pending 3" in shown
    finally:
        d.stop()
