"""Just enough ELF64 reading to check a kernel's PVH entry note and a binary's linkage."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

ELF_MAGIC = b"\x7fELF"
PT_INTERP = 3
PT_NOTE = 4
XEN_ELFNOTE_PHYS32_ENTRY = 18  # the PVH entry point, read by qemu's -kernel loader


def program_headers(elf: bytes) -> Iterator[tuple[int, bytes]]:
    """(p_type, segment bytes) for each program header of an ELF64 little-endian image."""
    if not elf.startswith(ELF_MAGIC) or elf[4] != 2:  # ELFCLASS64
        return
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from(
            "<IIQQQQ", elf, phoff + i * phentsize
        )
        yield p_type, elf[p_offset : p_offset + p_filesz]


def has_pvh_note(elf: bytes) -> bool:
    """True if the image has a "Xen" note of type XEN_ELFNOTE_PHYS32_ENTRY."""
    return any(
        p_type == PT_NOTE and _notes_have_pvh(segment)
        for p_type, segment in program_headers(elf)
    )


def is_static_executable(path: Path) -> bool:
    """True for an ELF executable with no program interpreter (runs in an empty initramfs)."""
    try:
        elf = path.read_bytes()
    except OSError:
        return False
    headers = list(program_headers(elf))
    return bool(headers) and all(p_type != PT_INTERP for p_type, _ in headers)


def _notes_have_pvh(notes: bytes) -> bool:
    pos = 0
    while pos + 12 <= len(notes):
        namesz, descsz, ntype = struct.unpack_from("<III", notes, pos)
        name = notes[pos + 12 : pos + 12 + namesz].rstrip(b"\0")
        if name == b"Xen" and ntype == XEN_ELFNOTE_PHYS32_ENTRY:
            return True
        pos += 12 + _align4(namesz) + _align4(descsz)
    return False


def _align4(n: int) -> int:
    return (n + 3) & ~3
