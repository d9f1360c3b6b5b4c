"""Where dqoes-cg lives on the filesystem: its runtime and state directories and its control
sockets (light to import: dqoesctl needs them)."""

from __future__ import annotations

from pathlib import Path

RUN_DIR = Path("/run/dqoes")
"""The runtime directory: the control socket and the rings (rings/<container>/ring)."""
STATE_DIR = Path("/var/lib/dqoes")
SOCKET_NAME = "dqoes.sock"
DEFAULT_SOCKET = RUN_DIR / SOCKET_NAME
MANAGER_SOCKET = RUN_DIR / "manager.sock"  # dqoes-manager's control socket
