"""Container images for the lab's Docker engines, made on the spot: no registry is reachable,
so an image is a tar of a few static executables given to `docker import`."""

from __future__ import annotations

import io
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

DOCKER = "/usr/bin/docker"  # Debian's client, of the engine's version


def image_tar(files: Mapping[str, Path], links: Mapping[str, str] | None = None) -> bytes:
    """A root filesystem holding `files` (path in the image: file on this host) and
    symbolic `links` (path in the image: what it points to)."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for arcname, path in files.items():
            tar.add(path, arcname=arcname)
        for arcname, target in (links or {}).items():
            link = tarfile.TarInfo(arcname)
            link.type, link.linkname = tarfile.SYMTYPE, target
            tar.addfile(link)
    return data.getvalue()


def import_image(docker: Sequence[str], tag: str, files: Mapping[str, Path],
                 links: Mapping[str, str] | None = None) -> None:
    """Import an image of `files` and `links` as `tag` with the `docker` command given."""
    subprocess.run([*docker, "import", "-", tag], input=image_tar(files, links), check=True,
                   capture_output=True, timeout=300)
