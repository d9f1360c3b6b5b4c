"""The cgroup layer: mount discovery, the cpu controller check and name resolution.

Fake-tree tests cover parsing and every layout; the `kernel` tests run the same functions
against the real mountinfo, cgroup tree and /proc.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dqoes_cg.cgroup import (
    CgroupError,
    Kind,
    Resolved,
    Runtime,
    find_cgroup2_mount,
    parse_mountinfo,
    require_cpu_controller,
    resolve,
)
from lab.fakecg import MOUNTINFO_HYBRID, MOUNTINFO_V1, MOUNTINFO_V2, make_cgroup

ID_A = "a1" + "0" * 62
ID_B = "a2" + "1" * 62
ID_C = "c3" + "2" * 62


def mountinfo(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mountinfo"
    path.write_text(text)
    return path


# --- the mount ------------------------------------------------------------------------


def test_parse_mountinfo_reads_fields_and_unescapes_paths() -> None:
    line = (rb"41 31 0:38 / /mnt/my\040cgroup\134x rw,relatime shared:7 master:2 - cgroup2 "
            rb"none rw,nsdelegate")
    [entry] = parse_mountinfo(line + b"\nnot a mountinfo line\n")
    assert entry.mount_point == Path("/mnt/my cgroup\\x")
    assert (entry.root, entry.fstype, entry.super_options) == ("/", "cgroup2",
                                                                ("rw", "nsdelegate"))


def test_find_cgroup2_mount(tmp_path: Path) -> None:
    assert find_cgroup2_mount(mountinfo(tmp_path, MOUNTINFO_V2)) == Path("/sys/fs/cgroup")
    hybrid = find_cgroup2_mount(mountinfo(tmp_path, MOUNTINFO_HYBRID))
    assert hybrid == Path("/sys/fs/cgroup/unified")


def test_find_cgroup2_mount_prefers_the_usual_place(tmp_path: Path) -> None:
    other = "50 27 0:23 / /mnt/cg rw - cgroup2 cgroup2 rw\n"
    assert find_cgroup2_mount(mountinfo(tmp_path, other + MOUNTINFO_V2)) == Path(
        "/sys/fs/cgroup")
    assert find_cgroup2_mount(mountinfo(tmp_path, other)) == Path("/mnt/cg")


@pytest.mark.parametrize(("text", "message"), [
    (MOUNTINFO_V1, "only cgroup v1 .* dqoes-cg is a cgroup v2 controller"),
    ("22 27 0:21 / /proc rw - proc proc rw\n", "no cgroup2 filesystem is mounted"),
    ("50 27 0:23 /docker/x /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "only as a subtree"),
])
def test_find_cgroup2_mount_refuses(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(CgroupError, match=message):
        find_cgroup2_mount(mountinfo(tmp_path, text))


def test_an_unreadable_mountinfo_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CgroupError, match="cannot read"):
        find_cgroup2_mount(tmp_path / "absent")


# --- the cpu controller ---------------------------------------------------------------


def test_cpu_controller_enabled_in_the_parent(tmp_path: Path) -> None:
    cgroup = make_cgroup(tmp_path, "a.slice/b.scope")
    require_cpu_controller(cgroup, tmp_path, mountinfo(tmp_path, MOUNTINFO_V2))


def test_cpu_controller_missing_below_the_root_names_the_fix(tmp_path: Path) -> None:
    cgroup = make_cgroup(tmp_path, "a/b/c")
    for d in ("a", "a/b"):
        (tmp_path / d / "cgroup.subtree_control").write_text("memory")
    with pytest.raises(CgroupError) as e:
        require_cpu_controller(cgroup, tmp_path, mountinfo(tmp_path, MOUNTINFO_V2))
    assert str(e.value) == (
        f"the cpu controller is not enabled for the children of {tmp_path}/a/b (needed by "
        f"c); enable it with: echo +cpu > {tmp_path}/a/cgroup.subtree_control; "
        f"echo +cpu > {tmp_path}/a/b/cgroup.subtree_control")


def test_cpu_controller_under_a_slice_suggests_systemd(tmp_path: Path) -> None:
    cgroup = make_cgroup(tmp_path, "system.slice/web.service")
    (tmp_path / "system.slice" / "cgroup.subtree_control").write_text("")
    with pytest.raises(CgroupError, match=r"set-property web\.service CPUAccounting=yes"):
        require_cpu_controller(cgroup, tmp_path, mountinfo(tmp_path, MOUNTINFO_V2))


def test_cpu_controller_bound_to_v1_is_explained(tmp_path: Path) -> None:
    cgroup = make_cgroup(tmp_path, "a", subtree_control="")
    (tmp_path / "cgroup.controllers").write_text("memory pids")
    with pytest.raises(CgroupError, match=r"bound to the cgroup v1 hierarchy at "
                       r"/sys/fs/cgroup/cpu,cpuacct: boot with systemd\.unified"):
        require_cpu_controller(cgroup, tmp_path, mountinfo(tmp_path, MOUNTINFO_HYBRID))


def test_the_root_cgroup_cannot_be_managed(tmp_path: Path) -> None:
    with pytest.raises(CgroupError, match="root cgroup"):
        require_cpu_controller(tmp_path, tmp_path)


# --- names: paths, PIDs, units --------------------------------------------------------


@pytest.fixture
def mount(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup"
    make_cgroup(root)
    return root


def test_resolve_paths(mount: Path) -> None:
    cgroup = make_cgroup(mount, "system.slice/web.service")
    expected = Resolved(cgroup, "/system.slice/web.service", Kind.PATH, unit="web.service")
    for name in ("system.slice/web.service", "/system.slice/web.service",
                 "./system.slice//web.service", str(cgroup)):
        assert resolve(name, mount) == expected
    make_cgroup(mount, "mine/job")
    assert resolve("mine/job", mount) == Resolved(mount / "mine/job", "/mine/job", Kind.PATH)


@pytest.mark.parametrize(("name", "message"), [
    ("nope/x", "no cgroup at"),
    ("system.slice/../..", "outside the cgroup2 mount"),
    ("", "is not a cgroup"),
    ("a\0b", "is not a cgroup"),
])
def test_resolve_bad_paths(mount: Path, name: str, message: str) -> None:
    make_cgroup(mount, "system.slice")
    with pytest.raises(CgroupError, match=message):
        resolve(name, mount)


def test_a_symlink_is_not_a_cgroup(mount: Path) -> None:
    (mount / "link").symlink_to(make_cgroup(mount, "real"))
    with pytest.raises(CgroupError, match="no cgroup at"):
        resolve("/link", mount)


def fake_proc(tmp_path: Path, pid: int, content: str) -> Path:
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(content)
    return proc


def test_resolve_pid(tmp_path: Path, mount: Path) -> None:
    cgroup = make_cgroup(mount, f"system.slice/docker-{ID_A}.scope")
    proc = fake_proc(tmp_path, 4242, f"0::/system.slice/docker-{ID_A}.scope\n")
    assert resolve("4242", mount, proc=proc) == Resolved(
        cgroup, f"/system.slice/docker-{ID_A}.scope", Kind.PID,
        unit=f"docker-{ID_A}.scope", container_id=ID_A)


def test_a_pid_in_cruns_subgroup_resolves_to_its_container(tmp_path: Path, mount: Path
                                                           ) -> None:
    scope = make_cgroup(mount, f"machine.slice/libpod-{ID_A}.scope")
    make_cgroup(mount, f"machine.slice/libpod-{ID_A}.scope/container")
    make_cgroup(mount, "system.slice/web.service/container")
    proc = fake_proc(tmp_path, 4242, f"0::/machine.slice/libpod-{ID_A}.scope/container\n")
    assert resolve("4242", mount, proc=proc) == Resolved(
        scope, f"/machine.slice/libpod-{ID_A}.scope", Kind.PID,
        unit=f"libpod-{ID_A}.scope", container_id=ID_A)
    # a child of that name in a cgroup that is no container's is the process's own
    proc = fake_proc(tmp_path / "other", 4242, "0::/system.slice/web.service/container\n")
    assert resolve("4242", mount, proc=proc).path == mount / "system.slice/web.service/container"


@pytest.mark.parametrize(("content", "message"), [
    (None, "no process with PID 4242"),
    ("1:name=systemd:/\n", "in no cgroup v2 hierarchy"),
    ("0::/../../other\n", "outside the cgroup2 mount"),
    ("0::/gone\n", "no cgroup at"),
])
def test_resolve_pid_errors(tmp_path: Path, mount: Path, content: str | None,
                            message: str) -> None:
    proc = fake_proc(tmp_path, 1, "0::/\n") if content is None else fake_proc(
        tmp_path, 4242, content)
    with pytest.raises(CgroupError, match=message):
        resolve("4242", mount, proc=proc)


def test_resolve_systemd_units(mount: Path) -> None:
    web = make_cgroup(mount, "system.slice/web.service")
    nested = make_cgroup(mount, "a.slice/a-b.slice/job.scope")
    make_cgroup(mount, "user.slice/user-1000.slice/user@1000.service/app.slice/mine.service")
    assert resolve("web.service", mount) == Resolved(web, "web.service", Kind.SYSTEMD_UNIT,
                                                     unit="web.service")
    assert resolve("job.scope", mount).path == nested
    assert resolve("a-b.slice", mount).path == nested.parent
    assert resolve("web.service", mount).is_systemd_unit
    with pytest.raises(CgroupError, match=r"no systemd unit 'mine\.service'"):
        resolve("mine.service", mount)  # the user manager's, not the system's


def test_an_ambiguous_unit_names_its_cgroups(mount: Path) -> None:
    make_cgroup(mount, "a.slice/x.scope")
    make_cgroup(mount, "b.slice/x.scope")
    with pytest.raises(CgroupError, match=r"ambiguous: /(a|b)\.slice/x\.scope, /(a|b)\.slice"):
        resolve("x.scope", mount)


# --- names: containers ----------------------------------------------------------------


LAYOUTS = [
    (f"system.slice/docker-{ID_A}.scope", Kind.DOCKER, True),
    (f"docker/{ID_A}", Kind.DOCKER, False),
    ("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/"
     f"cri-containerd-{ID_A}.scope", Kind.CRI, True),
    (f"kubepods.slice/kubepods-pod99.slice/crio-{ID_A}.scope", Kind.CRI, True),
    (f"kubepods/burstable/pod1234/{ID_A}", Kind.CRI, False),
    (f"machine.slice/libpod-{ID_A}.scope", Kind.PODMAN, True),
    (f"user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID_A}.scope",
     Kind.PODMAN, False),
    (f"libpod_parent/libpod-{ID_A}", Kind.PODMAN, False),
    (f"other/{ID_A}", Kind.CONTAINER, False),
]


@pytest.mark.parametrize(("rel", "kind", "is_unit"), LAYOUTS)
def test_resolve_container_ids_and_prefixes(mount: Path, rel: str, kind: Kind,
                                            is_unit: bool) -> None:
    cgroup = make_cgroup(mount, rel)
    make_cgroup(mount, f"system.slice/docker-{ID_C}.scope")
    for name in (ID_A, ID_A[:12], "a1"):
        found = resolve(name, mount)
        assert (found.path, found.kind, found.container_id) == (cgroup, kind, ID_A)
        assert found.display == ID_A[:12]
        assert found.is_systemd_unit == is_unit


def test_conmon_scopes_are_not_containers(mount: Path) -> None:
    make_cgroup(mount, f"machine.slice/libpod-conmon-{ID_A}.scope")
    make_cgroup(mount, f"kubepods.slice/crio-conmon-{ID_A}.scope")
    with pytest.raises(CgroupError, match="containers: none found"):
        resolve(ID_A[:12], mount)


def test_an_ambiguous_prefix_names_the_candidates(mount: Path) -> None:
    make_cgroup(mount, f"system.slice/docker-{ID_A}.scope")
    make_cgroup(mount, f"machine.slice/libpod-{ID_B}.scope")
    with pytest.raises(CgroupError) as e:
        resolve("a", mount)
    assert "'a' is ambiguous" in str(e.value)
    assert f"{ID_A[:12]} (docker)" in str(e.value) and f"{ID_B[:12]} (podman)" in str(e.value)


def test_a_missing_container_names_the_known_ones(mount: Path) -> None:
    make_cgroup(mount, f"system.slice/docker-{ID_A}.scope")
    with pytest.raises(CgroupError, match=rf"no container.*'ffff'.*{ID_A[:12]} \(docker\)"):
        resolve("ffff", mount)


def test_a_long_list_of_candidates_is_cut(mount: Path) -> None:
    for i in range(12):
        make_cgroup(mount, f"docker/{i:02x}{ID_A[2:]}")
    with pytest.raises(CgroupError, match="and 4 more"):
        resolve("zzz", mount)


def runtime(names: dict[str, str], label: str = "Docker (API at /run/docker.sock)",
            down: bool = False) -> Runtime:
    """A runtime that knows `names` (name -> ID), or cannot be asked."""
    def find(name: str) -> str | None:
        if down:
            raise CgroupError("not running (no socket)")
        return names.get(name)
    return Runtime(label, find)


def test_resolve_a_runtime_name(mount: Path) -> None:
    docker = runtime({"web": ID_A, "stopped": ID_B})
    cgroup = make_cgroup(mount, f"system.slice/docker-{ID_A}.scope")
    found = resolve("web", mount, runtimes=[docker])
    assert found == Resolved(cgroup, "web", Kind.DOCKER, unit=f"docker-{ID_A}.scope",
                             container_id=ID_A)
    with pytest.raises(CgroupError, match=rf"'stopped' \({ID_B[:12]}\) has no cgroup"):
        resolve("stopped", mount, runtimes=[docker])


def test_a_name_no_runtime_knows_says_which_were_searched(mount: Path) -> None:
    make_cgroup(mount, f"machine.slice/libpod-{ID_A}.scope")
    podman = runtime({"db": ID_A}, "Podman (API at /run/podman/podman.sock)")
    docker = runtime({}, down=True)
    assert resolve("db", mount, runtimes=[docker, podman]).container_id == ID_A
    with pytest.raises(CgroupError) as e:
        resolve("nosuch", mount, runtimes=[docker, podman])
    message = str(e.value)
    assert "searched: IDs in the cgroup tree; Docker (API at /run/docker.sock): not running " \
        "(no socket); Podman (API at /run/podman/podman.sock): none of that name" in message
    assert "\n" not in message


def test_a_full_id_wins_over_a_name_and_a_name_over_a_prefix(mount: Path) -> None:
    docker = runtime({"a1": ID_B})  # a name that is also a prefix of ID_A
    make_cgroup(mount, f"docker/{ID_A}")
    make_cgroup(mount, f"docker/{ID_B}")
    assert resolve("a1", mount, runtimes=[docker]).container_id == ID_B
    assert resolve(ID_A, mount, runtimes=[docker]).container_id == ID_A


def test_resolve_a_kubernetes_container_by_namespace_pod_and_name(tmp_path: Path,
                                                                   mount: Path) -> None:
    logs = tmp_path / "containers"
    logs.mkdir()
    for link in (f"web-7d4b9_shop_nginx-{ID_A}.log", f"web-7d4b9_shop_nginx-{ID_B}.log",
                 f"web-7d4b9_shop_sidecar-{ID_C}.log", "junk.log"):
        (logs / link).symlink_to("/nonexistent")
    pod = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice"
    cgroup = make_cgroup(mount, f"{pod}/cri-containerd-{ID_A}.scope")  # ID_B: an old one
    found = resolve("shop/web-7d4b9/nginx", mount, kube_logs=logs)
    assert (found.path, found.kind, found.container_id, found.display) == \
        (cgroup, Kind.CRI, ID_A, "shop/web-7d4b9/nginx")
    with pytest.raises(CgroupError, match=r"Kubernetes container.*no log link"):
        resolve("shop/web-7d4b9/other", mount, kube_logs=logs)
    with pytest.raises(CgroupError, match=rf"its container {ID_C[:12]} has no cgroup"):
        resolve("shop/web-7d4b9/sidecar", mount, kube_logs=logs)
    with pytest.raises(CgroupError, match="no cgroup at"):
        resolve("a/b", mount, kube_logs=logs)  # two parts: a cgroup path only


def test_the_walk_is_bounded(mount: Path) -> None:
    deep = make_cgroup(mount, "a/b/c/" + f"docker-{ID_A}.scope")
    assert resolve(ID_A[:8], mount, max_depth=4).path == deep
    with pytest.raises(CgroupError, match="no container"):
        resolve(ID_A[:8], mount, max_depth=3)
    with pytest.raises(CgroupError, match="more than 3 cgroups"):
        resolve(ID_A[:8], mount, max_cgroups=3)


# --- real cgroup v2 (kernel) ----------------------------------------------------------


@pytest.mark.kernel
def test_the_real_mount_and_controller(cgroup_root: Path, cgroup2_mount: Path) -> None:
    assert find_cgroup2_mount() == cgroup2_mount
    child = cgroup_root / "child"
    child.mkdir()
    require_cpu_controller(child, cgroup2_mount)
    grandchild = child / "grandchild"
    grandchild.mkdir()
    with pytest.raises(CgroupError, match=f"echo \\+cpu > {child}/cgroup.subtree_control$"):
        require_cpu_controller(grandchild, cgroup2_mount)
    (child / "cgroup.subtree_control").write_text("+cpu")
    require_cpu_controller(grandchild, cgroup2_mount)
    assert (grandchild / "cpu.max").exists()


@pytest.mark.kernel
def test_resolve_real_paths_and_pids(cgroup_root: Path, cgroup2_mount: Path) -> None:
    child = cgroup_root / "job"
    child.mkdir()
    rel = "/" + str(child.relative_to(cgroup2_mount))
    assert resolve(rel).path == child
    assert resolve(str(child)).display == rel
    proc = subprocess.Popen(["sh", "-c", f"echo $$ > {child}/cgroup.procs && exec sleep 60"])
    try:
        while not (child / "cgroup.procs").read_text().split():
            os.sched_yield()
        found = resolve(str(proc.pid))
        assert (found.path, found.kind) == (child, Kind.PID)
    finally:
        proc.kill()
        proc.wait()
