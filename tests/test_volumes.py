"""The dqoes volume driver (engines/volume_driver.py): Docker's plugin protocol, and the ring
volumes it makes: real tmpfs mounts on the real kernel (the guest), one per container."""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dqoes_cg.engines import volume_driver
from dqoes_cg.engines.volume_driver import (
    MAX_REQUEST,
    KernelMounts,
    Mounts,
    VolumeDriver,
    VolumePlugin,
    unit_name,
)
from dqoes_cg.ring import RingSet, Status

CAPACITY = 1024
DEADLINE_S = 60.0  # a loaded 2-core host


def wait_for(what: str, check: Callable[[], object]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S:.0f} s: {what}"
        time.sleep(0.05)


class NoMounts(Mounts):
    def mount(self, where: Path, size: int) -> None:
        raise AssertionError("no mount expected")

    def unmount(self, where: Path) -> None:
        raise AssertionError("no unmount expected")


def test_unit_names_are_systemds() -> None:
    assert unit_name(Path("/run/dqoes/volumes/ab-c.d_1")) == \
        r"run-dqoes-volumes-ab\x2dc.d_1.mount"
    assert unit_name(Path("/run/.x")) == r"run-\x2ex.mount"


class _Unix(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=10)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(str(self.path))


def post(path: Path, endpoint: str, body: bytes) -> dict:
    conn = _Unix(path)
    if len(body) > MAX_REQUEST:
        # Only the headers: the driver answers an oversized request without reading its body
        # and closes, so a client still sending the body would race that close.
        conn.putrequest("POST", endpoint)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
    else:
        conn.request("POST", endpoint, body)
    reply = conn.getresponse()
    assert reply.status == 200
    doc = json.loads(reply.read())
    conn.close()
    return doc


def test_the_protocol_over_its_socket(tmp_path: Path) -> None:
    driver = VolumeDriver(tmp_path / "run", CAPACITY, NoMounts())
    plugin = VolumePlugin(driver, tmp_path / "plugin.sock")
    try:
        assert oct(os.stat(plugin.path).st_mode & 0o777) == "0o600"
        sock = plugin.path
        assert post(sock, "/Plugin.Activate", b"") == {"Err": "", "Implements": ["VolumeDriver"]}
        assert post(sock, "/VolumeDriver.Capabilities", b"{}")["Capabilities"] == \
            {"Scope": "local"}
        assert post(sock, "/VolumeDriver.Create", b'{"Name": "v1"}') == {"Err": ""}
        assert post(sock, "/VolumeDriver.List", b"{}")["Volumes"] == [
            {"Name": "v1", "Mountpoint": "", "Status": {
                "mounted": False, "ring": str(tmp_path / "run/volumes/v1/ring")}}]
        assert post(sock, "/VolumeDriver.Path", b'{"Name": "v1"}')["Mountpoint"] == ""
        for endpoint, body, err in (
                ("/VolumeDriver.Create", b'{"Name": "../x"}', "bad volume name '../x'"),
                ("/VolumeDriver.Create", b'{"Name": "v2", "Opts": {"size": "1G"}}',
                 "takes no options"),
                ("/VolumeDriver.Get", b'{"Name": "nosuch"}', "no volume nosuch"),
                ("/VolumeDriver.Mount", b'{"Name": "v1"}', "Mount without an ID"),
                ("/VolumeDriver.Create", b"[" * 10000, "not valid JSON"),
                ("/VolumeDriver.Create", b"{" + b" " * 70000 + b"}", "request body"),
                ("/Nope", b"{}", "unknown endpoint")):
            assert err in post(sock, endpoint, body)["Err"], endpoint
        assert post(sock, "/VolumeDriver.Remove", b'{"Name": "v1"}') == {"Err": ""}
        assert post(sock, "/VolumeDriver.List", b"{}")["Volumes"] == []
    finally:
        plugin.close()
    assert not plugin.path.exists()


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[VolumeDriver]:
    d = VolumeDriver(tmp_path / "run", CAPACITY, KernelMounts())
    yield d
    for v in d.handle("/VolumeDriver.List", {})["Volumes"]:
        d.handle("/VolumeDriver.Unmount", {"Name": v["Name"], "ID": "cleanup"})


@pytest.mark.kernel
def test_a_volume_is_a_small_filesystem_with_a_ring_for_one_container(
        driver: VolumeDriver) -> None:
    mounted = driver.handle("/VolumeDriver.Mount", {"Name": "v1", "ID": "c1"})
    where = Path(mounted["Mountpoint"])
    assert mounted["Err"] == "" and os.path.ismount(where)
    assert oct(os.stat(driver.directory).st_mode & 0o777) == "0o700"
    with RingSet([where / "ring"], CAPACITY, recreate=False) as rings:
        assert rings.status[0] == Status.OK
    # A second container is refused; its Unmount does not take the first one's volume.
    second = driver.handle("/VolumeDriver.Mount", {"Name": "v1", "ID": "c2"})
    assert "mounted by another container" in second["Err"]
    assert driver.handle("/VolumeDriver.Unmount", {"Name": "v1", "ID": "c2"}) == {"Err": ""}
    assert os.path.ismount(where)
    assert "in use" in driver.handle("/VolumeDriver.Remove", {"Name": "v1"})["Err"]
    # Whatever the container writes fills its own small filesystem.
    stats = os.statvfs(where)
    assert stats.f_blocks * stats.f_frsize <= 2 * (where / "ring").stat().st_size + (80 << 10)
    with pytest.raises(OSError, match="No space left"), open(where / "fill", "wb") as f:
        for _ in range(1000):
            f.write(b"\0" * (64 << 10))
            f.flush()
            os.fsync(f.fileno())
    with pytest.raises(OSError, match="No space left"):
        for i in range(100):
            (where / f"f{i}").touch()
    assert driver.handle("/VolumeDriver.Unmount", {"Name": "v1", "ID": "c1"}) == {"Err": ""}
    assert not os.path.ismount(where)
    assert driver.handle("/VolumeDriver.Remove", {"Name": "v1"}) == {"Err": ""}
    assert not where.exists()


@pytest.mark.kernel
def test_an_unmount_with_the_ring_open_is_lazy(driver: VolumeDriver) -> None:
    where = Path(driver.handle("/VolumeDriver.Mount", {"Name": "v2", "ID": "c1"})["Mountpoint"])
    with RingSet([where / "ring"], CAPACITY, recreate=False) as rings:
        assert driver.handle("/VolumeDriver.Unmount", {"Name": "v2", "ID": "c1"}) == {"Err": ""}
        assert not os.path.ismount(where)
        rings.drain()  # the daemon's reader sees its ring gone, as with any removed ring
        assert rings.status[0] in (Status.OK, Status.UNUSED, Status.MISSING)


class FakeMounts(Mounts):
    """Mounts that only count as mounted: what the kernel keeps across a daemon's restart."""

    def __init__(self) -> None:
        self.points: set[Path] = set()

    def mount(self, where: Path, size: int) -> None:
        self.points.add(where)

    def unmount(self, where: Path) -> None:
        self.points.discard(where)

    def mounted(self, where: Path) -> bool:
        return where in self.points


def test_ownership_survives_a_restart(tmp_path: Path) -> None:
    mounts = FakeMounts()
    first = VolumeDriver(tmp_path / "run", CAPACITY, mounts)
    assert first.handle("/VolumeDriver.Mount", {"Name": "v1", "ID": "c1"})["Err"] == ""
    again = VolumeDriver(tmp_path / "run", CAPACITY, mounts)  # dqoesd restarted
    assert again.handle("/VolumeDriver.Mount", {"Name": "v1", "ID": "c1"})["Err"] == ""
    assert "mounted by another" in again.handle("/VolumeDriver.Mount",
                                                {"Name": "v1", "ID": "c2"})["Err"]
    again.handle("/VolumeDriver.Unmount", {"Name": "v1", "ID": "c2"})
    assert mounts.mounted(again.directory / "v1"), "not c2's to unmount"
    again.handle("/VolumeDriver.Unmount", {"Name": "v1", "ID": "c1"})
    assert not mounts.points and os.listdir(again.directory) == ["v1"]  # no record left
    assert "bad mount ID" in again.handle("/VolumeDriver.Mount",
                                          {"Name": "v1", "ID": "x\n" * 200})["Err"]


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[VolumePlugin]:
    p = VolumePlugin(VolumeDriver(tmp_path / "run", CAPACITY, NoMounts()),
                     tmp_path / "plugin.sock")
    yield p
    p.close()


def test_a_client_hanging_up_before_its_reply_is_one_line_a_minute(
        plugin: VolumePlugin, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    with caplog.at_level(logging.INFO):
        for _ in range(20):
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(str(plugin.path))
                client.sendall(b"POST /Plugin.Activate HTTP/1.0\r\nContent-Length: 0\r\n\r\n")
        wait_for("a line on a hang-up", lambda: "connection failed" in caplog.text)
        assert post(plugin.path, "/Plugin.Activate", b"")["Err"] == ""
    assert caplog.text.count("connection failed") == 1
    assert "Traceback" not in capsys.readouterr().err


def test_a_dripping_client_costs_only_its_own_connection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(volume_driver, "REQUEST_TIMEOUT_S", 1.0)
    plugin = VolumePlugin(VolumeDriver(tmp_path / "run", CAPACITY, NoMounts()),
                          tmp_path / "plugin.sock")
    cut_off, stop = threading.Event(), threading.Event()

    def drip() -> None:
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(plugin.path))
            try:
                for byte in iter(lambda: b"P", None):
                    client.sendall(byte)  # a byte every 0.1 s: each read is quick
                    if stop.wait(0.1):
                        return
            except OSError:
                cut_off.set()

    dripper = threading.Thread(target=drip)
    dripper.start()
    try:
        assert post(plugin.path, "/Plugin.Activate", b"")["Err"] == ""
        wait_for("the dripping client cut off at its request's deadline", cut_off.is_set)
    finally:
        stop.set()
        dripper.join()
        plugin.close()


def test_connections_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(volume_driver, "MAX_CONNECTIONS", 4)
    plugin = VolumePlugin(VolumeDriver(tmp_path / "run", CAPACITY, NoMounts()),
                          tmp_path / "plugin.sock")
    idle = [socket.socket(socket.AF_UNIX) for _ in range(4)]
    try:
        for s in idle:
            s.connect(str(plugin.path))
        with socket.socket(socket.AF_UNIX) as extra:
            extra.settimeout(DEADLINE_S)
            extra.connect(str(plugin.path))
            assert extra.recv(1) == b"", "the fifth connection is closed unanswered"
        for s in idle:
            s.close()

        def answered() -> bool:
            try:
                return post(plugin.path, "/Plugin.Activate", b"")["Err"] == ""
            except (http.client.HTTPException, OSError):
                return False  # not all closed connections are let go of yet
        wait_for("an answer once the idle connections are gone", answered)
    finally:
        for s in idle:
            s.close()
        plugin.close()
