"""Container images for the lab's Docker engines, made on the spot: no registry is reachable,
so an image is a tar of a few static executables given to `docker import`."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from lab import REPO

DOCKER = "/usr/bin/docker"  # Debian's client, of the engine's version
BUSYBOX = Path("/bin/busybox")  # static (busybox-static): an image of it alone runs anywhere
# An image in which this host's Python runs, its /usr bound read-only (python_run): a static
# busybox (BUSYBOX_FILES) and the links a merged-/usr system has at its root.
PYTHON_IMAGE = "lab/python:1"
BUSYBOX_FILES = {"busybox": BUSYBOX}
PYTHON_LINKS = {"lib": "usr/lib", "lib64": "usr/lib64", "bin": "usr/bin"}


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


def python_run(module: str, *args: str) -> tuple[list[str], list[str]]:
    """What runs `python -m module args` in PYTHON_IMAGE with `docker run` or `docker service
    create`: the options (this host's /usr, Python and the repository bound read-only, the
    environment) and the command."""
    prefix = Path(sys.base_prefix)
    mounts = [f"type=bind,src={path},dst={path},readonly"
              for path in sorted({Path("/usr"), prefix, REPO})]
    options = [*(flag for m in mounts for flag in ("--mount", m)),
               "--env", f"PYTHONPATH={REPO}", "--env", "PYTHONDONTWRITEBYTECODE=1",
               "--env", "PYTHONUNBUFFERED=1"]
    return options, [str(prefix / "bin" / "python3"), "-m", module, *args]
