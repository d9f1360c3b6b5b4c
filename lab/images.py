"""Container images for the lab's Docker engines, made on the spot: no registry is reachable,
so an image is a tar of a few static executables given to `docker import`."""

from __future__ import annotations

import io
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

DOCKER = "/usr/bin/docker"  # Debian's client, of the engine's version


def image_tar(files: Mapping[str, Path]) -> bytes:
    """A root filesystem holding `files` (path in the image: file on this host)."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for arcname, path in files.items():
            tar.add(path, arcname=arcname)
    return data.getvalue()


def import_image(docker: Sequence[str], tag: str, files: Mapping[str, Path]) -> None:
    """Import an image of `files` as `tag` with the `docker` command line given."""
    subprocess.run([*docker, "import", "-", tag], input=image_tar(files), check=True,
                   capture_output=True, timeout=300)
