"""The cgroup v2 layer off the hot path: find the mount, check the cpu controller, and
resolve what a user names as a container to its cgroup directory.

A name is, in this order of recognition:
  - a cgroup path (it contains a "/"): relative to the mount, or absolute under it;
  - a PID (up to 7 digits, pid_max's limit), through /proc/PID/cgroup;
  - a systemd unit of the system manager (ends in .service, .scope or .slice);
  - a container: its full ID, its name in a container runtime (Docker or Podman, asked
    through their APIs: `Runtime`), or a unique ID prefix, found in the cgroup tree under
    the usual layouts of Docker (systemd and cgroupfs drivers), Podman, and Kubernetes
    under containerd or CRI-O;
  - a Kubernetes container, NAMESPACE/POD/CONTAINER (when no cgroup has that path), found
    by the kubelet's log links (/var/log/containers/POD_NAMESPACE_CONTAINER-ID.log).
Every function takes the roots it reads (mount, /proc, the kubelet's log links) as
parameters, so that it can be tested on a fake tree.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath

MOUNTINFO = Path("/proc/self/mountinfo")
PROC = Path("/proc")
KUBE_LOGS = Path("/var/log/containers")
SYSFS_CGROUP = Path("/sys/fs/cgroup")

MAX_DEPTH = 10
"""Deepest cgroup searched below the mount (Kubernetes containers sit at depth 4-5)."""
MAX_CGROUPS = 50_000
"""Most cgroups searched before giving up on a name; real hosts hold a few thousand."""
MAX_PID_DIGITS = 7  # pid_max is at most 2**22
MAX_KUBE_LOGS = 50_000  # log links read from the kubelet's directory
MAX_LISTED = 8  # candidates named in an error message

UNIT_SUFFIXES = (".service", ".scope", ".slice")
# crun runs a container whose cgroup is delegated to it (Podman's systemd scopes) one level
# down, in this child: the container's cgroup, and systemd's unit, is still the parent.
CRUN_SUBGROUP = "container"
_ID = r"[0-9a-f]{64}"
_HEX = re.compile(r"[0-9a-f]+")


class CgroupError(Exception):
    """A one-line message saying what is wrong and, where possible, how to fix it."""


class InvalidName(CgroupError):
    """A name that can never name a cgroup here, whatever appears later."""


class Kind(StrEnum):
    """How a name was resolved: its form, or the container layout it was found under."""

    PATH = "path"
    PID = "pid"
    SYSTEMD_UNIT = "systemd-unit"
    DOCKER = "docker"
    PODMAN = "podman"
    CRI = "cri"
    CONTAINER = "container"  # a bare container ID under no layout we know


_LAYOUTS = (
    # (cgroup directory name, kind; None: decided by the parents)
    (re.compile(rf"docker-({_ID})\.scope"), Kind.DOCKER),
    (re.compile(rf"libpod-({_ID})(?:\.scope)?"), Kind.PODMAN),
    (re.compile(rf"(?:cri-containerd|crio)-({_ID})\.scope"), Kind.CRI),
    (re.compile(rf"({_ID})"), None),
)


@dataclass(frozen=True)
class Runtime:
    """A container runtime that knows its containers by name: `find` gives the ID of the
    container of that name, None if it has none, CgroupError if it cannot be asked."""

    name: str  # for messages: "Docker (API at /run/docker.sock)"
    find: Callable[[str], str | None]


@dataclass(frozen=True)
class Resolved:
    path: Path  # the absolute cgroup directory
    display: str  # a short name for messages and listings
    kind: Kind
    unit: str | None = None  # the system manager's unit owning the cgroup, if it is one
    container_id: str | None = None

    @property
    def is_systemd_unit(self) -> bool:
        return self.unit is not None


# --- the mount ------------------------------------------------------------------------


@dataclass(frozen=True)
class MountEntry:
    root: str  # the directory of the filesystem that is mounted
    mount_point: Path
    fstype: str
    super_options: tuple[str, ...]


def _unescape(field: bytes) -> str:
    """Undoes mountinfo's octal escapes (space, tab, newline, backslash)."""
    raw = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8) & 0xFF]), field)
    return os.fsdecode(raw)


def parse_mountinfo(data: bytes) -> list[MountEntry]:
    """Parses /proc/PID/mountinfo (proc(5)); lines it cannot read are skipped."""
    entries = []
    for line in data.splitlines():
        fields = line.split(b" ")
        try:
            sep = fields.index(b"-", 6)
        except ValueError:
            continue
        if len(fields) < sep + 4:
            continue
        entries.append(MountEntry(
            root=_unescape(fields[3]),
            mount_point=Path(_unescape(fields[4])),
            fstype=os.fsdecode(fields[sep + 1]),
            super_options=tuple(os.fsdecode(fields[sep + 3]).split(",")),
        ))
    return entries


def _read_mountinfo(mountinfo: Path) -> list[MountEntry]:
    try:
        return parse_mountinfo(mountinfo.read_bytes())
    except OSError as e:
        raise CgroupError(f"cannot read {mountinfo}: {e.strerror}") from None


def find_cgroup2_mount(mountinfo: Path = MOUNTINFO) -> Path:
    """Returns the mount point of the whole cgroup v2 hierarchy."""
    entries = _read_mountinfo(mountinfo)
    v2 = [e for e in entries if e.fstype == "cgroup2"]
    whole = [e for e in v2 if e.root == "/"]
    if whole:
        preferred = [e for e in whole if e.mount_point == SYSFS_CGROUP]
        return (preferred or whole)[0].mount_point
    if v2:
        raise CgroupError(f"cgroup2 is mounted only as a subtree ({v2[0].root} at "
                          f"{v2[0].mount_point}); dqoes-cg needs the whole hierarchy")
    if any(e.fstype == "cgroup" for e in entries):
        raise CgroupError("this host has only cgroup v1 hierarchies; dqoes-cg is a cgroup v2 "
                          "controller: boot with systemd.unified_cgroup_hierarchy=1")
    raise CgroupError("no cgroup2 filesystem is mounted; mount one with "
                      "`mount -t cgroup2 none /sys/fs/cgroup`")


def _controllers(path: Path) -> set[str]:
    """The controllers listed in a cgroup.controllers or cgroup.subtree_control file."""
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def require_cpu_on_mount(mount: Path, mountinfo: Path = MOUNTINFO) -> None:
    """Checks that the cgroup2 hierarchy at `mount` has the cpu controller (a v1/v2 hybrid
    host binds it to v1), and says how to get it when it does not."""
    if "cpu" in _controllers(mount / "cgroup.controllers"):
        return
    v1 = [e.mount_point for e in _read_mountinfo(mountinfo)
          if e.fstype == "cgroup" and "cpu" in e.super_options]
    where = f"; it is bound to the cgroup v1 hierarchy at {v1[0]}" if v1 else ""
    raise CgroupError(
        f"the cpu controller is not available on the cgroup2 mount {mount}{where}: boot "
        "with systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all")


def require_cpu_controller(cgroup: Path, mount: Path, mountinfo: Path = MOUNTINFO) -> None:
    """Checks that `cgroup` (under `mount`) gets the cpu controller from its parent, and
    says how to fix it when it does not."""
    if cgroup == mount:
        raise InvalidName(f"{cgroup} is the root cgroup, which has no cpu.max; "
                          "name a cgroup below it")
    parent = cgroup.parent
    if "cpu" in _controllers(parent / "cgroup.subtree_control"):
        return
    require_cpu_on_mount(mount, mountinfo)
    try:
        rel = parent.relative_to(mount)
    except ValueError:
        raise CgroupError(f"{cgroup} is not under the cgroup2 mount {mount}") from None
    chain = [mount / PurePosixPath(*rel.parts[:i]) for i in range(len(rel.parts) + 1)]
    first = next(i for i, d in enumerate(chain)
                 if "cpu" not in _controllers(d / "cgroup.subtree_control"))
    fix = "; ".join(f"echo +cpu > {d / 'cgroup.subtree_control'}" for d in chain[first:])
    if parent.name.endswith(".slice"):  # systemd manages it and may undo a manual fix
        fix += f" (or, lasting: systemctl set-property {cgroup.name} CPUAccounting=yes)"
    raise CgroupError(f"the cpu controller is not enabled for the children of {parent} "
                      f"(needed by {cgroup.name}); enable it with: {fix}")


# --- names ----------------------------------------------------------------------------


def resolve(name: str, mount: Path | None = None, *, proc: Path = PROC,
            runtimes: Sequence[Runtime] = (), kube_logs: Path = KUBE_LOGS,
            max_depth: int = MAX_DEPTH, max_cgroups: int = MAX_CGROUPS) -> Resolved:
    """Resolves `name` (see the module's docstring) to an existing cgroup directory."""
    found = resolve_many([name], mount or find_cgroup2_mount(), proc=proc,
                         runtimes=runtimes, kube_logs=kube_logs, max_depth=max_depth,
                         max_cgroups=max_cgroups)[name]
    if isinstance(found, CgroupError):
        raise found
    return found


def check_name(name: str) -> None:
    """InvalidName unless `name` has the form of a name `resolve` could ever find."""
    if not name or "\0" in name or len(name) > 4096 or name in (".", ".."):
        raise InvalidName(f"{name[:64]!r} is not a cgroup, container, unit or PID name")


def needs_walk(name: str) -> bool:
    """Whether resolving `name` walks the cgroup tree (a container or unit name), rather
    than looking at one path (a cgroup path or a PID)."""
    return "/" not in name and not (name.isascii() and name.isdigit()
                                    and len(name) <= MAX_PID_DIGITS)


def resolve_many(names: list[str], mount: Path, *, proc: Path = PROC,
                 runtimes: Sequence[Runtime] = (), kube_logs: Path = KUBE_LOGS,
                 max_depth: int = MAX_DEPTH, max_cgroups: int = MAX_CGROUPS
                 ) -> dict[str, Resolved | CgroupError]:
    """`resolve` for many names at once, with one walk of the cgroup tree for all those
    that need one: each name's Resolved, or the CgroupError it would raise."""
    found: dict[str, Resolved | CgroupError] = {}
    tree: list[PurePosixPath] | CgroupError | None = None

    def walked() -> list[PurePosixPath]:
        nonlocal tree
        if tree is None:
            try:
                tree = _walk(mount, max_depth, max_cgroups)
            except CgroupError as e:
                tree = e
        if isinstance(tree, CgroupError):
            raise tree
        return tree

    for name in names:
        try:
            check_name(name)
            if "/" in name:
                try:
                    found[name] = _resolve_path(name, mount)
                except InvalidName:
                    raise
                except CgroupError as e:
                    kube = _kube_name(name)
                    if kube is None:
                        raise
                    found[name] = _resolve_kube(name, kube, mount, walked(), kube_logs, e)
            elif not needs_walk(name):
                found[name] = _resolve_pid(name, mount, proc)
            elif name.endswith(UNIT_SUFFIXES):
                found[name] = _resolve_unit(name, mount, walked())
            else:
                found[name] = _resolve_container(name, mount, walked(), runtimes)
        except CgroupError as e:
            found[name] = e
    return found


def systemd_unit(rel: PurePosixPath) -> str | None:
    """The unit name if `rel` is a cgroup of the system manager: a unit directly in a slice
    (the user managers' units, under user@UID.service, are not)."""
    if rel.name.endswith(UNIT_SUFFIXES) and all(p.endswith(".slice") for p in rel.parts[:-1]):
        return rel.name
    return None


def _cgroup_path(rel: PurePosixPath) -> str:
    """How /proc/PID/cgroup writes the cgroup: absolute from the mount."""
    return "/" + rel.as_posix() if rel.parts else "/"


def _require_cgroup(mount: Path, rel: PurePosixPath, what: str) -> Path:
    if ".." in rel.parts:
        raise InvalidName(f"{what} lies outside the cgroup2 mount {mount}")
    path = mount / rel
    if path.is_symlink() or not (path / "cgroup.procs").is_file():
        raise CgroupError(f"{what}: no cgroup at {path}")
    return path


def _resolve_path(name: str, mount: Path) -> Resolved:
    given = PurePosixPath(name)
    if given.is_absolute() and (given == mount or mount in given.parents):
        rel = given.relative_to(mount)
    else:
        rel = PurePosixPath(name.lstrip("/"))
    path = _require_cgroup(mount, rel, f"cgroup path {name!r}")
    return Resolved(path, _cgroup_path(rel), Kind.PATH, unit=systemd_unit(rel))


def _resolve_pid(pid: str, mount: Path, proc: Path) -> Resolved:
    try:
        lines = (proc / pid / "cgroup").read_text().splitlines()
    except FileNotFoundError:
        raise CgroupError(f"no process with PID {pid}") from None
    except OSError as e:
        raise CgroupError(f"cannot read {proc / pid / 'cgroup'}: {e.strerror}") from None
    v2 = [line[3:] for line in lines if line.startswith("0::")]
    if not v2:
        raise CgroupError(f"process {pid} is in no cgroup v2 hierarchy")
    rel = PurePosixPath(v2[0].lstrip("/"))
    container = _container_in(rel)
    if container is None and rel.name == CRUN_SUBGROUP:
        container = _container_in(rel.parent)
        rel = rel.parent if container else rel
    path = _require_cgroup(mount, rel, f"process {pid}'s cgroup {v2[0]}")
    return Resolved(path, _cgroup_path(rel), Kind.PID, unit=systemd_unit(rel),
                    container_id=container.id if container else None)


def _walk(mount: Path, max_depth: int, max_cgroups: int) -> list[PurePosixPath]:
    """Every cgroup below `mount` (relative paths), at most `max_depth` levels down."""
    found: list[PurePosixPath] = []
    pending = [(PurePosixPath(), 0)]
    while pending:
        rel, depth = pending.pop()
        try:
            with os.scandir(mount / rel) as entries:
                children = [rel / e.name for e in entries if e.is_dir(follow_symlinks=False)]
        except OSError:  # removed while we walk
            continue
        found += children
        if len(found) > max_cgroups:
            raise CgroupError(f"more than {max_cgroups} cgroups under {mount}: "
                              "name the cgroup by its path instead")
        if depth + 1 < max_depth:
            pending += [(child, depth + 1) for child in children]
    return found


def _resolve_unit(name: str, mount: Path, tree: list[PurePosixPath]) -> Resolved:
    matches = [rel for rel in tree if rel.name == name and systemd_unit(rel)]
    if not matches:
        raise CgroupError(f"no systemd unit {name!r} has a cgroup under {mount}: "
                          "is it running?")
    if len(matches) > 1:
        raise CgroupError(f"unit {name!r} is ambiguous: "
                          + _listing([_cgroup_path(m) for m in matches]))
    rel = matches[0]
    container = _container_in(rel)
    return Resolved(mount / rel, name, Kind.SYSTEMD_UNIT, unit=name,
                    container_id=container.id if container else None)


@dataclass(frozen=True)
class _Container:
    id: str
    kind: Kind
    rel: PurePosixPath

    def __str__(self) -> str:
        return f"{self.id[:12]} ({self.kind})"


def _container_in(rel: PurePosixPath) -> _Container | None:
    """The container whose cgroup `rel` is, if it is one under a layout we know."""
    for pattern, kind in _LAYOUTS:
        match = pattern.fullmatch(rel.name)
        if not match:
            continue
        if kind is None:  # a cgroupfs driver: docker/<id>, kubepods/.../pod<uid>/<id>
            kind = (Kind.DOCKER if rel.parent.name == "docker"
                    else Kind.CRI if any(p.startswith("kubepods") for p in rel.parts)
                    else Kind.CONTAINER)
        return _Container(match[1], kind, rel)
    return None


def _resolve_container(name: str, mount: Path, tree: list[PurePosixPath],
                       runtimes: Sequence[Runtime]) -> Resolved:
    containers = [c for c in map(_container_in, tree) if c]
    matches = [c for c in containers if c.id == name]
    display = None
    searched = []
    for runtime in () if matches else runtimes:
        try:
            cid = runtime.find(name)
        except CgroupError as e:
            searched.append(f"{runtime.name}: {e}")
            continue
        if cid is None:
            searched.append(f"{runtime.name}: none of that name")
            continue
        matches = [c for c in containers if c.id == cid]
        if not matches:
            raise CgroupError(f"{runtime.name.split(' ')[0]} container {name!r} ({cid[:12]}) "
                              f"has no cgroup under {mount}: is it running?")
        display = name
        break
    if not matches and _HEX.fullmatch(name):
        matches = [c for c in containers if c.id.startswith(name)]
    if len(matches) > 1:
        raise CgroupError(f"{name!r} is ambiguous: it matches " + _listing(matches))
    if not matches:
        known = _listing(containers) if containers else "none found"
        where = "; ".join(["IDs in the cgroup tree", *searched])
        raise CgroupError(f"no container, unit or PID named {name!r} (searched: {where}; "
                          f"containers: {known}; name a cgroup path with a '/')")
    c = matches[0]
    return Resolved(mount / c.rel, display or c.id[:12], c.kind, unit=systemd_unit(c.rel),
                    container_id=c.id)


def _listing(items: list) -> str:
    shown = ", ".join(str(i) for i in items[:MAX_LISTED])
    more = len(items) - MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


# --- Kubernetes: the kubelet's links /var/log/containers/POD_NAMESPACE_CONTAINER-ID.log ----

_KUBE_PART = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
_KUBE_LOG = re.compile(rf"([^_]+)_([^_]+)_(.+)-({_ID})\.log")


def _kube_name(name: str) -> tuple[str, str, str] | None:
    """(namespace, pod, container) if `name` has that form."""
    parts = name.split("/")
    if len(parts) == 3 and all(_KUBE_PART.fullmatch(p) for p in parts):
        return parts[0], parts[1], parts[2]
    return None


def kube_container_ids(namespace: str, pod: str, container: str, logs: Path) -> list[str]:
    """The IDs of the containers the kubelet has log links for under that name (a container
    restarted has several), from the names of the links alone."""
    ids = []
    try:
        with os.scandir(logs) as entries:
            for k, entry in enumerate(entries):
                if k >= MAX_KUBE_LOGS:
                    break
                m = _KUBE_LOG.fullmatch(entry.name)
                if m and (m[1], m[2], m[3]) == (pod, namespace, container):
                    ids.append(m[4])
    except OSError:
        pass
    return ids


def _resolve_kube(name: str, kube: tuple[str, str, str], mount: Path,
                  tree: list[PurePosixPath], logs: Path, not_a_path: CgroupError) -> Resolved:
    ids = set(kube_container_ids(*kube, logs))
    matches = [c for c in map(_container_in, tree) if c and c.id in ids]
    if not matches:
        why = (f"its container {sorted(ids)[0][:12]} has no cgroup: is it running?" if ids
               else f"no log link in {logs}")
        raise CgroupError(f"{not_a_path}; nor is it a Kubernetes container "
                          f"(namespace/pod/container): {why}")
    if len(matches) > 1:
        raise CgroupError(f"{name!r} is ambiguous: it matches " + _listing(matches))
    c = matches[0]
    return Resolved(mount / c.rel, name, c.kind, unit=systemd_unit(c.rel), container_id=c.id)
