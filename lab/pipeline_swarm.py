"""The lab pipeline on a lab Swarm (lab/swarm.py): five stage services (lab/pipeline_stage.py)
on an overlay network of their own, declared a pipeline by their labels, and the load
generator (lab/pipeline_load.py) as a one-shot service on the same network.

    flow = PipelineFlow(swarm)                 # the image and the network
    flow.create_stages(target="20s")           # framer -> detector -> ... -> uploader
    summary = flow.run_load(out_dir, "60:1")   # its summary (pipeline_load.summary + outcomes)
    flow.remove()

No registry is reachable and the guest's Python is the host's, shared read-only: the image is
the static busybox and the links /lib, /lib64, /bin into /usr, and each task bind-mounts
/usr, this Python's installation and the repository, read-only, from the node (every node
of the lab Swarm sees the guest's files). The services use DNS round robin
(`--endpoint-mode dnsrr`): the engines run without iptables, which Swarm's virtual IPs need;
each stage looks its next stage's name up (at most every 2 s) and picks one of its tasks
for each request. A stage stopped (a move, a scale in) drains its requests first:
its grace period is longer than its drain.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lab.guest.e2e import VOLUME
from lab.images import BUSYBOX_FILES, PYTHON_IMAGE, PYTHON_LINKS, python_run
from lab.pipeline_stage import DRAIN_S
from lab.shell import wait_for
from lab.swarm import Swarm
from lab.swarm_cluster import CONVERGE_S

NETWORK = "dqoes-pipeline"
PIPELINE = "video"
STAGES = ("framer", "detector", "analyzer", "recognizer", "uploader")  # Darly's, as a chain
PORT = 7000
LOAD = "pipeline-load"
STAGE_GRACE_S = DRAIN_S + 10.0  # its drain, and the interpreter's exit


def stage_labels(stages: Sequence[str], target: str) -> dict[str, dict[str, str]]:
    """Each stage's service labels: a chain, the first with the end-to-end target (mean).
    No stage has a dqoes.target or dqoes.metric of its own: the manager gives each its share."""
    labels: dict[str, dict[str, str]] = {}
    for i, name in enumerate(stages):
        labels[name] = {"dqoes.pipeline": PIPELINE}
        if i + 1 < len(stages):
            labels[name]["dqoes.next"] = stages[i + 1]
    labels[stages[0]] |= {"dqoes.pipeline.target": target, "dqoes.pipeline.metric": "mean"}
    return labels


class PipelineFlow:
    def __init__(self, swarm: Swarm, stages: Sequence[str] = STAGES, model: str = "micro"
                 ) -> None:
        self.swarm = swarm
        self.stages = tuple(stages)
        self.model = model
        swarm.import_image(PYTHON_IMAGE, BUSYBOX_FILES, PYTHON_LINKS)
        swarm.docker("network", "create", "--driver", "overlay", NETWORK)

    def _python(self, module: str, *args: str, options: Sequence[str] = (),
                grace_s: float = 0.0) -> tuple[list[str], list[str]]:
        """The service options and command that run `python -m module args` in a task,
        stopped by SIGKILL `grace_s` after its SIGTERM."""
        opts, command = python_run(module, *args)
        return [*opts, "--network", NETWORK, "--endpoint-mode", "dnsrr",
                "--stop-grace-period", f"{grace_s:g}s", *options], command

    def create_stages(self, target: str | None, options: Sequence[str] = (),
                      replicas: int = 1) -> None:
        """The stages as services of `replicas` each, a chain, the first with the pipeline's
        end-to-end target (mean), each with a dqoes volume (its ring); no pipeline labels at
        all if `target` is None (a deployment dqoes-cg leaves alone)."""
        labels = stage_labels(self.stages, target) if target else {}
        for i, name in enumerate(self.stages):
            nexts = ["--next", f"{self.stages[i + 1]}:{PORT}"] if i + 1 < len(self.stages) else []
            opts, command = self._python(
                "lab.pipeline_stage", "--name", name, "--model", self.model,
                "--port", str(PORT), *nexts, grace_s=STAGE_GRACE_S,
                options=[*(o for k, v in labels.get(name, {}).items()
                           for o in ("--label", f"{k}={v}")),
                         "--mount", VOLUME, "--update-order", "start-first", *options])
            self.swarm.create_service(name, PYTHON_IMAGE, command, replicas, options=opts)
        for name in self.stages:
            self.swarm.wait_running(name, replicas)

    def remove_stages(self) -> None:
        """The stage services gone (the network stays, for the next deployment)."""
        self._remove(*self.stages)

    def _remove(self, *services: str) -> None:
        names = self.swarm.docker("service", "ls", "--format", "{{.Name}}").split()
        gone = [name for name in services if name in names]
        if gone:
            self.swarm.remove_service(*gone)

    def run_load(self, out_dir: Path, *phases: str, seed: int = 0,
                 ready_within_s: float = CONVERGE_S) -> dict[str, Any]:
        """The load generator as a one-shot service sending to the first stage, once it
        answers end to end; its summary once it wrote it (in `out_dir`)."""
        out = out_dir / f"load-{seed}.json"
        out.unlink(missing_ok=True)
        opts, command = self._python(
            "lab.pipeline_load", "--to", f"{self.stages[0]}:{PORT}",
            *(arg for phase in phases for arg in ("--phase", phase)), "--seed", str(seed),
            "--ready-within", str(ready_within_s), "--out", f"/results/{out.name}",
            options=["--mount", f"type=bind,src={out_dir},dst=/results",
                     "--restart-condition", "none"])
        self.swarm.create_service(LOAD, PYTHON_IMAGE, command, options=opts)
        duration = sum(float(phase.split(":")[0]) for phase in phases)
        try:
            wait_for(out.exists, ready_within_s + 4 * duration + CONVERGE_S,
                     "the load generator's summary",
                     lambda: self.swarm.docker("service", "ps", "--no-trunc", LOAD)
                     + self.swarm.docker("service", "logs", "--raw", LOAD, timeout=120),
                     every=5.0)
        finally:
            self.swarm.remove_service(LOAD)
        doc: dict[str, Any] = json.loads(out.read_text())
        return doc

    def remove(self) -> None:
        self._remove(*self.stages, LOAD)
        self.swarm.docker("network", "rm", NETWORK)
