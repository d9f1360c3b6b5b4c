"""A fake cgroup v2 tree in a temporary directory, for unit tests of parsing and name
resolution. It never stands in for the real-kernel tests of a feature."""

from __future__ import annotations

from pathlib import Path

CPU_STAT = (
    "usage_usec 1000\nuser_usec 600\nsystem_usec 400\ncore_sched.force_idle_usec 0\n"
    "nr_periods 10\nnr_throttled 2\nthrottled_usec 300\nnr_bursts 0\nburst_usec 0\n"
)
CPU_MAX = "max 100000\n"
CPU_WEIGHT = "100\n"
CPU_PRESSURE = ("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
MEMORY_PRESSURE = IO_PRESSURE = CPU_PRESSURE
CONTROLLERS = "cpuset cpu io memory pids"

MOUNTINFO_V2 = (
    "22 27 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"
    "25 27 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n"
)
MOUNTINFO_HYBRID = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)
MOUNTINFO_V1 = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
)


def make_cgroup(mount: Path, rel: str = "", *, cpu_stat: str | bytes = CPU_STAT,
                cpu_max: str | bytes = CPU_MAX, cpu_pressure: str | bytes = CPU_PRESSURE,
                cpu_weight: str | bytes = CPU_WEIGHT, subtree_control: str = "cpu",
                memory_pressure: str | bytes = MEMORY_PRESSURE,
                io_pressure: str | bytes = IO_PRESSURE) -> Path:
    """Creates (or rewrites) the cgroup `rel` under `mount` with the usual files; its
    ancestors become cgroups too, with `subtree_control` enabled where they have none."""
    path = mount / rel
    for d in [*reversed(path.relative_to(mount).parents), Path(rel)]:
        ancestor = mount / d
        ancestor.mkdir(parents=True, exist_ok=True)
        for name, text in (("cgroup.procs", ""), ("cgroup.controllers", CONTROLLERS),
                           ("cgroup.subtree_control", subtree_control)):
            if not (ancestor / name).exists():
                (ancestor / name).write_text(text)
    (path / "cgroup.subtree_control").write_text(subtree_control)
    write(path / "cpu.stat", cpu_stat)
    write(path / "cpu.max", cpu_max)
    write(path / "cpu.pressure", cpu_pressure)
    write(path / "cpu.weight", cpu_weight)
    write(path / "memory.pressure", memory_pressure)
    write(path / "io.pressure", io_pressure)
    return path


def write(path: Path, content: str | bytes) -> None:
    """Rewrites a file in place (same inode), as the kernel's files change under an open fd."""
    path.write_bytes(content.encode() if isinstance(content, str) else content)
