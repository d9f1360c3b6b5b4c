"""dqoes-cg's cluster on a lab Swarm (lab/swarm.py): dqoesd and dqoes-agent on every node,
dqoes-manager on the manager node, each a process of its node, logging into the node's run
directory; and what the tests and the cluster experiment do around them.

    daemons = ClusterDaemons(swarm, dqoesd_args=["--interval", "2"])
    wait_volume_driver(swarm)                   # Swarm places tasks with dqoes volumes
    daemons.wait("three tasks in S", lambda doc: ...)   # `dqoesctl cluster status --json`
    daemons.stop("manager"); daemons.start_manager("--placement", "qoe")
    daemons.close(); reopen_nodes(swarm)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dqoes_cg.cluster.show import format_cluster
from dqoes_cg.cluster.swarmapi import PAUSED_LABEL
from dqoes_cg.cluster.view import ClusterView
from dqoes_cg.control import DaemonUnavailable, RequestError, request
from dqoes_cg.engines.volume_driver import DRIVER, SOCKET_NAME, plugin_spec
from lab.shell import sh, wait_for
from lab.swarm import Node, Swarm

REPO = Path(__file__).resolve().parent.parent
CONVERGE_S = 600.0  # minutes: seven Python daemons and three engines on an emulated CPU
INFER_IMAGE = "lab/infer:1"  # the static inference server (lab/guest/infer.c) alone
# Agents report every 2 s; on an emulated CPU shared with other guests a report may come
# tens of seconds late, which must not make a node that runs well unreachable.
NODE_TIMEOUT_S = 60.0


class ClusterDaemons:
    """dqoesd (with `dqoesd_args`) and dqoes-agent on every node, dqoes-manager on the
    manager node; each node's engine finds its dqoesd's volume driver (a spec file in the
    node's /etc/docker)."""

    def __init__(self, swarm: Swarm, dqoesd_args: Sequence[str] = ()) -> None:
        self.swarm = swarm
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.manager_socket = swarm.manager.run_dir / "dqoes-manager.sock"
        for node in swarm.nodes:
            run = self.run_dir(node)
            spec = node.etc_docker / "plugins" / f"{DRIVER}.spec"
            spec.parent.mkdir(exist_ok=True)
            spec.write_text(plugin_spec(run / SOCKET_NAME))
            self._start(f"dqoesd-{node.name}", node, "dqoes_cg.daemon", "--cpus", str(node.cpus),
                        "--engine-socket", str(node.socket),
                        "--run-dir", str(run), "--state-dir", str(run / "state"), *dqoesd_args)
            self._start(f"agent-{node.name}", node, "dqoes_cg.cluster.agent", "--engine-socket",
                        str(node.socket), "--socket", str(run / "dqoes.sock"), "--interval", "2")
        self.start_manager()

    def start_manager(self, *options: str) -> None:
        self._start("manager", self.swarm.manager, "dqoes_cg.cluster.managerd",
                    "--engine-socket", str(self.swarm.manager.socket), "--socket",
                    str(self.manager_socket), "--tick", "2", "--node-timeout",
                    str(NODE_TIMEOUT_S), *options)

    @staticmethod
    def run_dir(node: Node) -> Path:
        return node.run_dir / "dqoes"

    def log(self, name: str) -> Path:
        node = self.swarm.manager if name == "manager" else self.swarm.node(name.split("-", 1)[1])
        return node.run_dir / f"{name}.log"

    def _start(self, name: str, node: Node, module: str, *args: str) -> None:
        with self.log(name).open("ab") as log:
            self.processes[name] = node.spawn(
                [sys.executable, "-m", module, *args], stdin=subprocess.DEVNULL, stdout=log,
                stderr=log, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)

    def stop(self, name: str) -> None:
        process = self.processes[name]
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # dqoesd gives its limits back
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def close(self) -> None:
        for name in self.processes:
            self.stop(name)
        for node in self.swarm.nodes:
            (node.etc_docker / "plugins" / f"{DRIVER}.spec").unlink(missing_ok=True)

    def logs(self) -> str:
        """The last lines of each daemon's log, and the manager's last placement decisions
        (a move's story outlasts the tail)."""
        tails = []
        for name in self.processes:
            lines = self.log(name).read_text(errors="replace").splitlines()
            tails.append(f"--- {name}\n" + "\n".join(lines[-15:]))
            if name == "manager":
                decisions = [line for line in lines if "placement:" in line][-40:]
                tails.append("--- manager's placement decisions\n" + "\n".join(decisions))
        return "\n".join(tails)

    def status(self) -> dict[str, Any] | None:
        """What `dqoesctl cluster status --json` shows (None while the manager does not
        answer), asked here: a dqoesctl process every few seconds costs the emulated CPU
        seconds of its own."""
        try:
            view: dict[str, Any] = request(self.manager_socket, "cluster-status", timeout=120)
        except (DaemonUnavailable, RequestError):
            return None
        return view

    def table(self) -> str:
        """What `dqoesctl cluster status` shows ("" while the manager does not answer)."""
        doc = self.status()
        return format_cluster(ClusterView.from_json(doc)) if doc is not None else ""

    def wait(self, what: str, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The manager's view once `check` holds for it."""
        def ready() -> dict[str, Any] | None:
            doc = self.status()
            return doc if doc is not None and check(doc) else None

        return wait_for(ready, CONVERGE_S, what, lambda: self.table() + self.logs(), every=3.0)


def volume_drivers(swarm: Swarm, node: str) -> set[str]:
    """The volume drivers a node's engine lists to Swarm (which places a task with a volume
    only on a node that lists its driver)."""
    plugins = json.loads(swarm.docker("node", "inspect", "--format",
                                      "{{json .Description.Engine.Plugins}}", node)) or []
    return {p["Name"] for p in plugins if p["Type"] == "Volume"}


def wait_volume_driver(swarm: Swarm) -> None:
    """Wait until every node's engine lists the dqoes volume driver to Swarm."""
    wait_for(lambda: all(DRIVER in volume_drivers(swarm, n.name) for n in swarm.nodes),
             CONVERGE_S, "every engine listing the dqoes volume driver to Swarm",
             lambda: str({n.name: volume_drivers(swarm, n.name) for n in swarm.nodes}),
             every=3.0)


def import_infer(swarm: Swarm, infer: Path) -> float:
    """The inference server as INFER_IMAGE on every node; its work units per millisecond of
    CPU here (the image's command takes units per request)."""
    swarm.import_image(INFER_IMAGE, {"infer": infer})
    ms = 100
    return int(sh(infer, "--calibrate", str(ms)).strip()) / ms


def node_labels(swarm: Swarm, node: str) -> dict[str, str]:
    return json.loads(swarm.docker("node", "inspect", "--format", "{{json .Spec.Labels}}",
                                   node)) or {}


def reopen_nodes(swarm: Swarm) -> None:
    """Every node that placement paused to new tasks active again, its label removed (once
    no manager runs that could pause it again)."""
    for node in swarm.nodes:
        if PAUSED_LABEL in node_labels(swarm, node.name):
            swarm.docker("node", "update", "--availability", "active", "--label-rm",
                         PAUSED_LABEL, node.name)
