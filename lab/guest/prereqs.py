"""What this host lacks to boot the guest, named by the Debian packages that provide it
(lab/guest/install-deps installs them)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from .elf import is_static_executable
from .initramfs import BUSYBOX
from .kernel import find_kernel
from .vm import QEMU


def missing_guest_packages(tools: Mapping[str, str] | None = None) -> list[str]:
    """Debian packages to install before a guest can boot and find `tools` (package: a
    path it installs) in the host's tree; empty if none."""
    missing = []
    if shutil.which(QEMU) is None:
        missing.append("qemu-system-x86")
    if find_kernel() is None:
        missing.append("linux-image-amd64")
    if not is_static_executable(BUSYBOX):
        missing.append("busybox-static")
    return missing + [package for package, path in (tools or {}).items()
                      if not Path(path).exists()]
