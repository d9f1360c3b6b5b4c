"""Build the guest's initramfs: static busybox, the modules that reach the 9p root, and
stage1-init, packed as an uncompressed newc cpio (nothing to decompress on an emulated CPU).
"""

from __future__ import annotations

import hashlib
import io
import stat
from pathlib import Path

from lab.images import BUSYBOX

from .kernel import Kernel, atomic_write, cache_dir

GUEST_DIR = Path(__file__).resolve().parent

# What stage1-init needs before it can switch_root: the virtio-mmio transport, the 9p client
# over virtio, and overlayfs. Their dependencies come from modules.dep.
ROOT_MODULES = ("virtio_mmio", "9pnet_virtio", "9p", "overlay")


def builtin_modules(kernel: Kernel) -> set[str]:
    """Names of modules built into the kernel (modules.builtin), normalised with '_'."""
    listing = kernel.modules / "modules.builtin"
    lines = listing.read_text().split() if listing.exists() else []
    return {_module_name(line) for line in lines}


def module_load_order(kernel: Kernel, wanted: tuple[str, ...] = ROOT_MODULES) -> list[str]:
    """Relative paths (under the module tree) of the .ko files to insmod, dependencies
    first. Modules that are built in are skipped."""
    deps: dict[str, tuple[str, list[str]]] = {}
    for line in (kernel.modules / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[_module_name(path)] = (path, [_module_name(d) for d in rest.split()])
    builtin = builtin_modules(kernel)
    order: list[str] = []

    def visit(name: str) -> None:
        if name in builtin or deps[name][0] in order:
            return
        for dep in deps[name][1]:
            visit(dep)
        order.append(deps[name][0])

    for name in wanted:
        name = name.replace("-", "_")
        if name not in deps and name not in builtin:
            raise RuntimeError(f"kernel {kernel.version} has no module {name}")
        visit(name)
    return order


def _module_name(path: str) -> str:
    """'kernel/net/9p/9pnet_virtio.ko[.xz]' -> '9pnet_virtio'."""
    return Path(path).name.split(".ko")[0].replace("-", "_")


def initramfs_path(kernel: Kernel) -> Path:
    """The initramfs for `kernel`, built on each call (it takes milliseconds) but stored in
    the cache under its content hash, so unchanged images are not rewritten."""
    image = build_initramfs(kernel)
    path = cache_dir() / f"initramfs-{kernel.version}-{hashlib.sha256(image).hexdigest()[:16]}"
    if not path.exists():
        atomic_write(path, image)
    return path


def build_initramfs(kernel: Kernel, busybox: Path = BUSYBOX) -> bytes:
    """The initramfs image as bytes."""
    archive = _Cpio()
    for d in ("bin", "dev", "proc", "sys", "lower", "rw", "newroot", "lib", "lib/modules"):
        archive.add_dir(d)
    archive.add_char_device("dev/console", 5, 1)
    archive.add_file("bin/busybox", busybox.read_bytes(), 0o755)
    archive.add_file("init", (GUEST_DIR / "stage1-init").read_bytes(), 0o755)
    modules = module_load_order(kernel)
    for rel in modules:
        name = Path(rel).name
        if name.endswith((".xz", ".zst", ".gz")):
            raise RuntimeError(f"{rel}: compressed modules are not supported by busybox insmod")
        archive.add_file(f"lib/modules/{name}", (kernel.modules / rel).read_bytes(), 0o644)
    archive.add_file("modules.load", "".join(Path(r).name + "\n" for r in modules).encode(), 0o644)
    return archive.finish()


class _Cpio:
    """Writer for the 'newc' cpio format the kernel unpacks (no external cpio needed)."""

    def __init__(self) -> None:
        self._out = io.BytesIO()
        self._ino = 0

    def add_dir(self, name: str) -> None:
        self._entry(name, stat.S_IFDIR | 0o755, b"", nlink=2)

    def add_file(self, name: str, data: bytes, mode: int) -> None:
        self._entry(name, stat.S_IFREG | mode, data)

    def add_char_device(self, name: str, major: int, minor: int) -> None:
        self._entry(name, stat.S_IFCHR | 0o600, b"", rdev=(major, minor))

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0, b"")
        return self._out.getvalue()

    def _entry(
        self, name: str, mode: int, data: bytes, nlink: int = 1, rdev: tuple[int, int] = (0, 0)
    ) -> None:
        self._ino += 1
        encoded = name.encode() + b"\0"
        fields = (self._ino, mode, 0, 0, nlink, 0, len(data), 0, 0, *rdev, len(encoded), 0)
        header = b"070701" + b"".join(b"%08x" % f for f in fields)
        self._write_padded(header + encoded)
        self._write_padded(data)

    def _write_padded(self, chunk: bytes) -> None:
        self._out.write(chunk)
        self._out.write(b"\0" * (-self._out.tell() % 4))
