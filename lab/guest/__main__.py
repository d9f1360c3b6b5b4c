"""python3 -m lab.guest [options] -- CMD ARGS...

Boot one throwaway cgroup v2 guest, run CMD in the current directory inside it with this
environment, stream its output and exit with its status (125 if the guest failed, 124 if
it timed out).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .prereqs import missing_guest_packages
from .swarm_guest import SWARM_INIT, SWARM_MEMORY_MIB, missing_swarm_guest_packages
from .systemd_guest import SYSTEMD_INIT, missing_systemd_guest_packages
from .vm import (
    BUSYBOX_INIT,
    DEFAULT_MEMORY_MIB,
    Guest,
    GuestConfig,
    GuestError,
    GuestTimeout,
    Share,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m lab.guest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="seconds CMD may run (default: no limit)")
    parser.add_argument("--boot-timeout", type=float, default=60.0, metavar="S")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--memory", type=int, default=None, metavar="MIB",
                        help=f"default: {DEFAULT_MEMORY_MIB}, or {SWARM_MEMORY_MIB} with --swarm")
    parser.add_argument("--append", action="append", default=[], metavar="ARG",
                        help="extra kernel argument (repeatable), e.g. loglevel=7")
    parser.add_argument("--writable", action="append", default=[], type=Path, metavar="DIR",
                        help="a host directory the guest may write to, at the same path "
                             "(repeatable); everything else the guest writes is thrown away")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--systemd", action="store_true",
                      help="boot the host's systemd as PID 1 (the end-to-end tests' guest)")
    mode.add_argument("--swarm", action="store_true",
                      help="the guest of the multi-node Swarm (python3 -m lab.swarm)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="report the boot time")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    init_mode, missing, memory = (
        (SYSTEMD_INIT, missing_systemd_guest_packages(), DEFAULT_MEMORY_MIB) if args.systemd
        else (SWARM_INIT, missing_swarm_guest_packages(), SWARM_MEMORY_MIB) if args.swarm
        else (BUSYBOX_INIT, missing_guest_packages(), DEFAULT_MEMORY_MIB))
    if missing:
        print(f"cannot boot the guest: missing {', '.join(missing)} "
              "(`make deps` installs them)", file=sys.stderr)
        return 125

    config = GuestConfig(init_mode=init_mode, cpus=args.cpus, memory_mib=args.memory or memory,
                         cmdline_extra=tuple(args.append), boot_timeout=args.boot_timeout,
                         shares=tuple(Share(f"rw{i}", d.resolve(), writable=True)
                                      for i, d in enumerate(args.writable)))
    with Guest(config) as guest:
        try:
            status = guest.run(command, run_timeout=args.timeout)
        except GuestError as e:
            print(f"guest: {e}", file=sys.stderr)
            return 124 if isinstance(e, GuestTimeout) else 125
        if args.verbose:
            print(f"guest: booted in {guest.boot_seconds:.2f} s", file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
