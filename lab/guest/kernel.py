"""Find the host's Debian kernel and turn its bzImage into a cached ELF vmlinux for PVH boot.

qemu's microvm machine boots an uncompressed ELF kernel directly through its PVH entry
point (a Xen ELF note), skipping the bzImage decompressor and any firmware detour.
"""

from __future__ import annotations

import gzip
import lzma
import os
import platform
import re
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .elf import ELF_MAGIC, has_pvh_note

# bzImage boot protocol (Documentation/arch/x86/boot.rst).
_SETUP_SECTS = 0x1F1
_HEADER_MAGIC = 0x202
_PAYLOAD_OFFSET = 0x248  # u32 payload_offset, u32 payload_length; relative to protected mode


@dataclass(frozen=True)
class Kernel:
    """A kernel the guest can boot: its version, bzImage and module tree on the host."""

    version: str
    bzimage: Path
    modules: Path

    @property
    def config(self) -> Path:
        return Path("/boot") / f"config-{self.version}"


def find_kernel(version: str | None = None) -> Kernel | None:
    """The kernel to boot: `version` if given, else the running one if Debian ships it,
    else the newest /boot/vmlinuz-* that has a module tree. None if there is none."""
    installed = [p.name.removeprefix("vmlinuz-") for p in Path("/boot").glob("vmlinuz-*")]
    newest_first = sorted(installed, key=_version_key, reverse=True)
    for v in [version] if version else [platform.release(), *newest_first]:
        kernel = Kernel(v, Path("/boot") / f"vmlinuz-{v}", Path("/lib/modules") / v)
        if kernel.bzimage.is_file() and (kernel.modules / "modules.dep").is_file():
            return kernel
    return None


def _version_key(version: str) -> list[tuple[int, str]]:
    """Sort key for "6.1.0-9-amd64" < "6.1.0-56-amd64": numbers compare as numbers."""
    return [(int(part), "") if part.isdigit() else (-1, part)
            for part in re.split(r"(\d+)", version)]


def cache_dir() -> Path:
    """Where built guest artefacts live: $XDG_CACHE_HOME/dqoes-guest, else ~/.cache."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dqoes-guest"


def vmlinux_path(kernel: Kernel) -> Path:
    """The cached ELF vmlinux for `kernel`, extracted on first use."""
    stat = kernel.bzimage.stat()
    # Keyed by version and by the bzImage's identity, so a rebuilt package invalidates it.
    out = cache_dir() / f"vmlinux-{kernel.version}-{stat.st_size}-{int(stat.st_mtime)}"
    if not out.exists():
        data = extract_vmlinux(kernel.bzimage.read_bytes())
        if not has_pvh_note(data):
            raise RuntimeError(f"{kernel.bzimage}: kernel has no PVH entry note (CONFIG_PVH=n)")
        atomic_write(out, data)
    return out


def extract_vmlinux(bzimage: bytes) -> bytes:
    """The uncompressed ELF kernel inside a bzImage."""
    if bzimage[_HEADER_MAGIC : _HEADER_MAGIC + 4] != b"HdrS":
        raise ValueError("not a bzImage (no HdrS boot header)")
    setup_sects = bzimage[_SETUP_SECTS] or 4
    offset, length = struct.unpack_from("<II", bzimage, _PAYLOAD_OFFSET)
    start = (setup_sects + 1) * 512 + offset
    payload = bzimage[start : start + length]
    data = _decompress(payload)
    if not data.startswith(ELF_MAGIC):
        raise ValueError("bzImage payload did not decompress to an ELF file")
    return data


def _decompress(payload: bytes) -> bytes:
    """Decompress by the payload's magic. The kernel build appends the uncompressed size
    (4 bytes) to every payload: drop it so each decompressor sees a clean stream."""
    stream = payload[:-4]
    if stream.startswith(b"\xfd7zXZ\x00"):
        return lzma.decompress(stream, lzma.FORMAT_XZ)
    if stream.startswith(b"\x5d\x00\x00"):
        return lzma.decompress(stream, lzma.FORMAT_ALONE)
    if stream.startswith(b"\x1f\x8b"):
        return gzip.decompress(stream)
    if stream.startswith(b"\x28\xb5\x2f\xfd"):
        unzstd = subprocess.run(["zstd", "-dcq"], input=stream, capture_output=True, check=True)
        return unzstd.stdout
    raise ValueError(f"unsupported bzImage compression (magic {stream[:6].hex()})")


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temporary file and rename, so concurrent sessions never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
