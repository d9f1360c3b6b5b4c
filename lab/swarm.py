"""A Docker Swarm of several real nodes on one real cgroup v2 kernel (the swarm guest,
lab/guest/swarm_guest.py): each node is a dockerd of its own in a network namespace of its
own, with its own data and exec roots, hostname, /etc/docker, and a cgroup subtree capped
at the node's CPU budget.

    swarm = Swarm(THREE_NODES).up(images={BUSYBOX_IMAGE: {"busybox": BUSYBOX}})
    swarm.create_service("sleepers", BUSYBOX_IMAGE, ["/busybox", "sleep", "1d"], replicas=3)
    swarm.wait_running("sleepers", 3)          # {"node1": [Task], "node2": [...], ...}
    node = swarm.node("node2")                 # .socket, .docker, .cgroup, .tls, .node_id,
                                               # .etc_docker
    node.spawn(["dqoesd", ...])                # a process of that node
    node.kill_dockerd(); node.start_dockerd()  # faults: kill_dockerd, cut_link
    swarm.down()

Node N, the i-th (from 0):
- network namespace N; its eth0 has 10.77.0.(11+i)/24, its peer veth-N is a port of the
  bridge swarm0 (10.77.0.1) in the root namespace: the nodes' only network;
- /etc/netns/N/docker: its /etc/docker (`ip netns exec` binds it over /etc/docker);
- /var/lib/lab-swarm/N: its data root, on a tmpfs (overlay2 cannot sit on the guest's
  overlay root); the Swarm CA and its TLS identity under swarm/certificates;
- /run/lab-swarm/N: its exec root (exec/), dockerd's socket, pid file and log, its
  containerd's configuration, state, socket and log;
- /sys/fs/cgroup/lab-swarm/N/docker: its containers (--cgroup-parent), cpu.max = its budget;
- /sys/fs/cgroup/lab-swarm/N/system: its dockerd, containerd, shims and the processes
  started with Node.spawn (uncapped: the budget is the containers' CPU).

A node's namespaces are held by an idle process made with `ip netns exec N unshare --uts`:
its network namespace, a mount namespace whose /etc/docker is the node's and whose fresh
/sys has cgroup2 mounted again, and its hostname. Every process of the node enters them
(Node.command, nsenter): containerd (the node's own, not dockerd's: dockerd gives the one it
starts 15 s, too short here), dockerd (which then shares its mounts with containerd's runc,
and can be killed and started again), and whatever a test runs on the node. No registry is
reachable: images are imported on every node, services are created
with --no-resolve-image, and the engines run their tasks from local images without trying
a pull first (DOCKER_SERVICE_PREFER_OFFLINE_IMAGE). Engines run with --iptables=false:
Swarm's control plane and tasks on the default bridge need no packet filter, and each of
the ~50 iptables calls of an engine's start takes seconds on the emulated CPU. For the same
reason the Swarm has no ingress network (no routing mesh: publish ports in host mode):
every node would set up its sandbox, overlay and filter rules at its first container, a
minute on the emulated CPU.
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from dqoes_cg.actuator import format_cpu_max
from dqoes_cg.cgtable import DEFAULT_PERIOD_USEC
from lab.cgroups import remove_cgroup_tree
from lab.images import DOCKER, import_image
from lab.shell import sh, wait_for

T = TypeVar("T")

BRIDGE = "swarm0"
SUBNET = ipaddress.IPv4Network("10.77.0.0/24")
GATEWAY = SUBNET[1]  # the bridge's address: the root namespace reaches every node
SWARM_PORT = 2377
DATA_DIR = Path("/var/lib/lab-swarm")
RUN_DIR = Path("/run/lab-swarm")
ETC_NETNS = Path("/etc/netns")
CGROUP_MOUNT = Path("/sys/fs/cgroup")
CGROUP_NAME = "lab-swarm"
CONTROLLERS = "+cpuset +cpu +io +memory +pids"
BUSYBOX_IMAGE = "lab/busybox:1"  # the tag of that image, busybox at /busybox
# The process that holds a node's namespaces (sh -c SCRIPT NAME), in its network namespace
# and a UTS namespace of its own: the node's hostname, and cgroup2 mounted again on the
# fresh /sys that `ip netns exec` gives (in a mount namespace of its own).
_BECOME_NODE = ('hostname "$0" && mount -t cgroup2 -o nsdelegate,nosuid,nodev,noexec cgroup2 '
                '/sys/fs/cgroup && exec sleep infinity')
_CONTAINERD_CONFIG = """\
version = 2
root = "{node.data_root}/containerd"
state = "{node.run_dir}/containerd"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "{node.containerd_socket}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{node.data_root}/containerd/opt"
"""
SERVICE_LABEL = "com.docker.swarm.service.name"  # on every task's container
IFF_UP = 0x1  # a link's flag: administratively up
# A node is down to the manager some heartbeats after its last (Swarm's default period: 5 s);
# on a loaded host an engine of the emulated CPU stalls longer than that, and Swarm then
# moved running tasks to another node mid-test.
DISPATCHER_HEARTBEAT = "20s"
START_TIMEOUT = 600.0  # an engine's start, a join, a service's convergence: minutes on TCG


class EngineError(RuntimeError):
    """The Engine API answered with an error."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cpus: float  # the node's CPU budget: cpu.max of its containers' subtree
    manager: bool = False


THREE_NODES = (NodeSpec("node1", 0.5, manager=True), NodeSpec("node2", 0.5),
               NodeSpec("node3", 0.5))


@dataclass(frozen=True)
class NodeTLS:
    """A node's Swarm identity, as its dockerd keeps it: the Swarm root CA's certificate, the
    node's certificate (signed by that CA; its CN is the node ID, its OU the role, its O the
    Swarm's ID) and key. The key file is PEM with Swarm's own headers (kek-version, a
    manager's raft-dek), which OpenSSL refuses: key_pem() is the key alone."""

    ca_cert: Path
    cert: Path
    key: Path

    def key_pem(self) -> bytes:
        """The node's private key as plain PEM (for ssl.SSLContext.load_cert_chain)."""
        lines = self.key.read_bytes().splitlines(keepends=True)
        return b"".join(line for line in lines if b": " not in line and line.strip())


@dataclass(frozen=True)
class NodeStatus:
    """A node as the managers see it."""

    state: str  # ready, down, unknown, disconnected
    availability: str  # active, pause, drain
    role: str  # manager, worker
    reachability: str  # a manager's: reachable, unreachable; "" for a worker
    labels: Mapping[str, str]


@dataclass(frozen=True)
class Task:
    """One task of a service, as the managers see it."""

    id: str
    node: str  # the node's name; "" while unassigned
    slot: int
    state: str  # observed: new, pending, assigned, ..., running, shutdown, failed, ...
    desired_state: str
    container_id: str  # "" until the task has a container


class Engine:
    """Docker's Engine API on a unix socket: small JSON answers over plain HTTP/1.1."""

    def __init__(self, path: Path, timeout: float = 60.0) -> None:
        self.path = path
        self.timeout = timeout

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def request(self, method: str, path: str) -> Any:
        """The decoded JSON answer (text for /_ping, None if empty). Raises EngineError on
        an error status, OSError if nothing listens."""
        connection = _UnixHTTPConnection(self.path, self.timeout)
        try:
            connection.request(method, path)
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        if response.status >= 400:
            raise EngineError(f"{method} {path}: {response.status} "
                              f"{body.decode(errors='replace')}")
        if not body:
            return None
        if response.getheader("Content-Type", "").startswith("application/json"):
            return json.loads(body)
        return body.decode()

    def answers(self) -> bool:
        try:
            return self.get("/_ping") == "OK"
        except (OSError, EngineError, http.client.HTTPException):
            return False


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(str(self._unix_path))
        self.sock = sock


class Node:
    """One Swarm node: a dockerd in a network namespace of its own (see the module's doc)."""

    def __init__(self, spec: NodeSpec, index: int) -> None:
        self.name = spec.name
        self.cpus = spec.cpus
        self.manager = spec.manager
        self.address = str(SUBNET[11 + index])
        self.link = f"veth-{spec.name}"  # its link's end in the root namespace
        self.data_root = DATA_DIR / spec.name
        self.run_dir = RUN_DIR / spec.name
        self.etc_docker = ETC_NETNS / spec.name / "docker"  # its /etc/docker
        self.exec_root = self.run_dir / "exec"
        self.socket = self.run_dir / "docker.sock"
        self.log = self.run_dir / "dockerd.log"
        self.cgroup = CGROUP_MOUNT / CGROUP_NAME / spec.name / "docker"
        self.system_cgroup = CGROUP_MOUNT / CGROUP_NAME / spec.name / "system"
        self.docker = (DOCKER, "--host", f"unix://{self.socket}")
        self.engine = Engine(self.socket)
        self.containerd_socket = self.run_dir / "containerd.sock"
        self.node_id = ""  # its Swarm node ID, once it joined
        self._holder: subprocess.Popen[bytes] | None = None  # holds its namespaces
        self._dockerd: subprocess.Popen[bytes] | None = None
        self._processes: list[subprocess.Popen[bytes]] = []  # all it started, to reap

    def __repr__(self) -> str:
        return f"Node({self.name}, {self.address}, {self.cpus} CPUs)"

    @property
    def tls(self) -> NodeTLS:
        certificates = self.data_root / "swarm" / "certificates"
        return NodeTLS(certificates / "swarm-root-ca.crt", certificates / "swarm-node.crt",
                       certificates / "swarm-node.key")

    @property
    def cpu_max(self) -> str:
        """The cpu.max line of the containers' subtree: the node's budget."""
        return format_cpu_max(round(self.cpus * DEFAULT_PERIOD_USEC), DEFAULT_PERIOD_USEC)

    # -- its namespaces and processes -------------------------------------------------

    def boot(self) -> None:
        """Make the node's namespaces, held by an idle process, and start its containerd;
        start_dockerd() waits for containerd to answer."""
        holder = self._popen(self._in_system_cgroup(
            ["ip", "netns", "exec", self.name, "unshare", "--uts", "--",
             "sh", "-c", _BECOME_NODE, self.name]))

        def ready() -> bool:
            if holder.poll() is not None:
                raise AssertionError(f"{self.name}: making its namespaces failed "
                                     f"(status {holder.returncode})")
            return _comm(holder) == "sleep"

        wait_for(ready, START_TIMEOUT, f"{self.name}'s namespaces", every=0.2)
        self._holder = holder
        config = self.run_dir / "containerd.toml"
        config.write_text(_CONTAINERD_CONFIG.format(node=self))
        with (self.run_dir / "containerd.log").open("ab") as log:
            self.spawn(["containerd", "--config", config], stdin=subprocess.DEVNULL,
                       stdout=log, stderr=log)

    def command(self, argv: Sequence[str | Path]) -> list[str]:
        """`argv` run as this node: in its system cgroup, and in its network, mount and UTS
        namespaces (its network, its /etc/docker, its cgroup2 mount, its hostname)."""
        assert self._holder is not None, f"{self.name} was not booted"
        return self._in_system_cgroup(
            ["nsenter", f"--target={self._holder.pid}", "--net", "--mount", "--uts", "--",
             *map(str, argv)])

    def spawn(self, argv: Sequence[str | Path], **popen: Any) -> subprocess.Popen[bytes]:
        """Start `argv` as this node (command()) in a session of its own; `popen` goes to
        subprocess.Popen. down() kills it if it still runs then."""
        return self._popen(self.command(argv), **popen)

    def _in_system_cgroup(self, argv: list[str]) -> list[str]:
        return ["sh", "-c", 'echo $$ >"$0" && exec "$@"',
                str(self.system_cgroup / "cgroup.procs"), *argv]

    def _popen(self, argv: list[str], **popen: Any) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(argv, start_new_session=True, **popen)
        self._processes.append(process)
        return process

    def reap(self) -> None:
        """Kill and wait for every process this node started that still runs."""
        for process in self._processes:
            process.kill()
            process.wait()

    def run_docker(self, *args: str, timeout: float = 300) -> str:
        """The docker CLI bound to this node's engine; its output."""
        return sh(*self.docker, *args, timeout=timeout)

    # -- its engine --------------------------------------------------------------------

    def start_dockerd(self, timeout: float = START_TIMEOUT) -> None:
        """Start the node's dockerd (again, after a kill: it rejoins the Swarm by itself)
        once its containerd answers, and wait for its API."""
        wait_for(lambda: _accepts(self.containerd_socket), timeout,
                 f"{self.name}'s containerd", lambda: _tail(self.run_dir / "containerd.log"),
                 every=0.5)
        argv = ["dockerd", "--containerd", self.containerd_socket,
                "--data-root", self.data_root, "--exec-root", self.exec_root,
                "--pidfile", self.run_dir / "docker.pid", "--host", f"unix://{self.socket}",
                "--cgroup-parent", f"/{self.cgroup.relative_to(CGROUP_MOUNT)}",
                "--storage-driver", "overlay2", "--iptables=false", "--userland-proxy=false"]
        env = {**os.environ, "DOCKER_SERVICE_PREFER_OFFLINE_IMAGE": "1"}
        with self.log.open("ab") as log:
            dockerd = self.spawn(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 env=env)
        self._dockerd = dockerd

        def answers() -> bool:
            if dockerd.poll() is not None:
                raise AssertionError(f"{self.name}: dockerd exited\n{self.log_tail()}")
            return self.engine.answers()

        wait_for(answers, timeout, f"{self.name}'s dockerd", self.log_tail, every=1.0)

    @property
    def dockerd_running(self) -> bool:
        return self._dockerd is not None and self._dockerd.poll() is None

    def kill_dockerd(self) -> None:
        """SIGKILL the node's dockerd, as a crash would (containerd and the containers live
        on)."""
        assert self._dockerd is not None
        self._dockerd.kill()
        self._dockerd.wait()

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log, lines)

    # -- its link ----------------------------------------------------------------------

    def cut_link(self) -> None:
        """Take the node off the network (its bridge port down), as a pulled cable would."""
        _set_link(self.link, "down")

    def restore_link(self) -> None:
        _set_link(self.link, "up")

    @property
    def link_up(self) -> bool:
        return bool(int(Path(f"/sys/class/net/{self.link}/flags").read_text(), 16) & IFF_UP)

    # -- its containers ----------------------------------------------------------------

    def container_pid(self, container_id: str) -> int:
        return int(self.engine.get(f"/containers/{container_id}/json")["State"]["Pid"])

    def container_cgroup(self, container_id: str) -> Path:
        """The cgroup a container's main process is in (a child of `cgroup`)."""
        text = Path(f"/proc/{self.container_pid(container_id)}/cgroup").read_text()
        return CGROUP_MOUNT / text.strip().removeprefix("0::/")


class Swarm:
    """The nodes of `specs` (at least one manager; the first one initializes the Swarm).
    up() builds it all, down() removes it all; one Swarm at a time per kernel."""

    def __init__(self, specs: Sequence[NodeSpec] = THREE_NODES) -> None:
        if not any(spec.manager for spec in specs):
            raise ValueError("a Swarm needs a manager")
        if len({spec.name for spec in specs}) != len(specs):
            raise ValueError("node names must be unique")
        if len(specs) > SUBNET.num_addresses - 12:
            raise ValueError(f"at most {SUBNET.num_addresses - 12} nodes on {SUBNET}")
        self.nodes = [Node(spec, i) for i, spec in enumerate(specs)]
        self.timings: dict[str, float] = {}  # seconds of each step of up()

    @property
    def manager(self) -> Node:
        """The node that initialized the Swarm: cluster-wide commands go there."""
        return next(node for node in self.nodes if node.manager)

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    def docker(self, *args: str, timeout: float = 300) -> str:
        """The docker CLI on the manager; its output."""
        return self.manager.run_docker(*args, timeout=timeout)

    # -- building and removing it ------------------------------------------------------

    def up(self, images: Mapping[str, Mapping[str, Path]] | None = None,
           timeout: float = START_TIMEOUT) -> Swarm:
        """Networks, cgroups and engines; init on the manager, joins, every node Ready; and
        meanwhile `images` (tag: files, as import_image takes them) on every node."""
        started = time.monotonic()
        try:
            self._step("network", self._make_network)
            _make_dirs(self.nodes)
            self._step("nodes", lambda: _each(self.nodes, Node.boot))
            self._step("engines", lambda: _each(self.nodes, lambda n: n.start_dockerd(timeout)))
            with ThreadPoolExecutor(1) as background:
                imported = background.submit(self._step, "images", lambda: [
                    self.import_image(tag, files) for tag, files in (images or {}).items()])
                self._step("init", self._init)
                self._step("joins", self._join_all)
                self._step("ready", lambda: self._wait_ready(timeout))
                imported.result()
        except BaseException:
            self.down()
            raise
        self.timings["up"] = time.monotonic() - started
        return self

    def down(self) -> None:
        """Kill every process of every node, remove their cgroups, namespaces, network and
        files. Safe to call on a half-built Swarm."""
        from pyroute2 import IPRoute, netns

        remove_cgroup_tree(CGROUP_MOUNT / CGROUP_NAME, timeout=120)
        for node in self.nodes:
            node.reap()
            if node.name in netns.listnetns():
                netns.remove(node.name)  # with it, its end of the veth pair and the pair
            shutil.rmtree(ETC_NETNS / node.name, ignore_errors=True)
        with IPRoute() as ipr:
            if ipr.link_lookup(ifname=BRIDGE):
                ipr.link("del", ifname=BRIDGE)
        if os.path.ismount(DATA_DIR):
            sh("umount", "--lazy", DATA_DIR)
        shutil.rmtree(RUN_DIR, ignore_errors=True)

    def _step(self, name: str, step: Callable[[], object]) -> None:
        started = time.monotonic()
        step()
        self.timings[name] = time.monotonic() - started

    def _make_network(self) -> None:
        """The bridge, and each node's namespace with its end of a veth pair to it."""
        from pyroute2 import IPRoute

        # Before the namespaces are made, which copy it: each node's engine forwards
        # between its bridge and eth0.
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        with IPRoute() as ipr:
            ipr.link("add", ifname=BRIDGE, kind="bridge")
            bridge = ipr.link_lookup(ifname=BRIDGE)[0]
            ipr.addr("add", index=bridge, address=str(GATEWAY), prefixlen=SUBNET.prefixlen)
            ipr.link("set", index=bridge, state="up")
            for node in self.nodes:
                with IPRoute(netns=node.name, flags=os.O_CREAT) as ns:
                    ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
                ipr.link("add", ifname=node.link, kind="veth",
                         peer={"ifname": "eth0", "net_ns_fd": node.name})
                ipr.link("set", index=ipr.link_lookup(ifname=node.link)[0], master=bridge,
                         state="up")
                with IPRoute(netns=node.name) as ns:
                    eth0 = ns.link_lookup(ifname="eth0")[0]
                    ns.addr("add", index=eth0, address=node.address,
                            prefixlen=SUBNET.prefixlen)
                    ns.link("set", index=eth0, state="up")

    def _wait_ready(self, timeout: float) -> None:
        self.wait_nodes("ready", timeout)
        for node in self.nodes:
            node.node_id = node.engine.get("/info")["Swarm"]["NodeID"]
        wait_for(lambda: all(path.exists() for node in self.nodes
                             for path in vars(node.tls).values()),
                 timeout, "every node's TLS identity")

    def _init(self) -> None:
        """Init on the manager, and remove the routing mesh's network (see the module's doc)
        before any node sets it up."""
        manager = self.manager
        manager.run_docker("swarm", "init", "--advertise-addr", manager.address,
                           "--listen-addr", f"{manager.address}:{SWARM_PORT}",
                           "--dispatcher-heartbeat", DISPATCHER_HEARTBEAT)
        manager.engine.request("DELETE", "/networks/ingress")

    def _join_all(self) -> None:
        """Managers one at a time (each joins the Raft group), then workers all at once."""
        others = [node for node in self.nodes if node is not self.manager]
        for node in others:
            if node.manager:
                self._join(node)
        _each([node for node in others if not node.manager], self._join)

    def _join(self, node: Node) -> None:
        tokens = self.manager.engine.get("/swarm")["JoinTokens"]
        node.run_docker("swarm", "join", "--token",
                        tokens["Manager" if node.manager else "Worker"],
                        "--advertise-addr", node.address,
                        "--listen-addr", f"{node.address}:{SWARM_PORT}",
                        f"{self.manager.address}:{SWARM_PORT}", timeout=START_TIMEOUT)

    def restore(self, timeout: float = START_TIMEOUT) -> list[str]:
        """Put the Swarm back as up() left it, whatever a test did to it: every node's link
        up and its dockerd running, no service, every node Ready and active with no label.
        What it had to change, one line each (none if nothing)."""
        changed = []
        for node in self.nodes:
            if not node.link_up:
                node.restore_link()
                changed.append(f"{node.name}: its link up again")
            if not node.dockerd_running:
                node.start_dockerd(timeout)
                changed.append(f"{node.name}: its dockerd started again")
        services = self.docker("service", "ls", "--format", "{{.Name}}").split()
        if services:
            self.remove_service(*services, timeout=timeout)
            changed.append(f"services removed: {', '.join(services)}")
        for name, status in self.wait_nodes("ready", timeout).items():
            if status.availability != "active" or status.labels:
                self.docker("node", "update", "--availability", "active",
                            *(arg for label in status.labels for arg in ("--label-rm", label)),
                            name)
                changed.append(f"{name}: {status.availability} with labels "
                               f"{dict(status.labels)}, now active with none")
        return changed

    # -- what the managers see ---------------------------------------------------------

    def node_status(self) -> dict[str, NodeStatus]:
        """Every node by name, as the manager sees it."""
        statuses = {}
        for entry in self.manager.engine.get("/nodes"):
            manager_status = entry.get("ManagerStatus") or {}
            statuses[entry["Description"]["Hostname"]] = NodeStatus(
                state=entry["Status"]["State"], availability=entry["Spec"]["Availability"],
                role=entry["Spec"]["Role"], reachability=manager_status.get("Reachability", ""),
                labels=entry["Spec"].get("Labels") or {})
        return statuses

    def wait_nodes(self, states: str | Mapping[str, str], timeout: float = START_TIMEOUT,
                   ) -> dict[str, NodeStatus]:
        """Wait until the manager sees each node in its state (one state: all in it)."""
        wanted = ({node.name: states for node in self.nodes} if isinstance(states, str)
                  else dict(states))

        def reached() -> dict[str, NodeStatus] | None:
            statuses = self.node_status()
            return statuses if all(name in statuses and statuses[name].state == state
                                   for name, state in wanted.items()) else None

        return wait_for(reached, timeout, f"nodes {wanted}", self._explain_nodes)

    def _explain_nodes(self) -> str:
        try:
            nodes = self.docker("node", "ls", timeout=120)
        except (AssertionError, subprocess.TimeoutExpired) as e:
            nodes = str(e)
        return nodes + "\n".join(node.log_tail(15) for node in self.nodes)

    # -- images and services -----------------------------------------------------------

    def import_image(self, tag: str, files: Mapping[str, Path],
                     links: Mapping[str, str] | None = None) -> None:
        """The image of `files` (path in the image: file here) and symbolic `links` as
        `tag` on every node."""
        _each(self.nodes, lambda node: import_image(node.docker, tag, files, links))

    def create_service(self, name: str, image: str, command: Sequence[str], replicas: int = 1,
                       constraints: Iterable[str] = (), options: Iterable[str] = ()) -> str:
        """Create a service (the image must be on the nodes: import_image); its ID. The
        CLI's `options` go before the image."""
        flags = [flag for constraint in constraints for flag in ("--constraint", constraint)]
        return self.docker("service", "create", "--detach", "--no-resolve-image",
                           "--name", name, "--replicas", str(replicas), *flags, *options,
                           image, *command).strip()

    def update_service(self, name: str, *options: str) -> None:
        """`docker service update` with these options (e.g. --constraint-add ...)."""
        self.docker("service", "update", "--detach", "--no-resolve-image", *options, name)

    def remove_service(self, *names: str, timeout: float = START_TIMEOUT) -> None:
        """Remove services and wait until none of their tasks has a container left."""
        self.docker("service", "rm", *names)
        queries = [f"/containers/json?all=1&filters={_filters(label=[f'{SERVICE_LABEL}={name}'])}"
                   for name in names]

        def gone() -> bool:
            return not any(node.engine.get(query) for query in queries
                           for node in self.nodes if node.dockerd_running)

        wait_for(gone, timeout, f"the containers of {', '.join(names)} removed")

    def tasks(self, service: str) -> list[Task]:
        """Every task of a service the manager remembers, the ended ones too."""
        names = {node.node_id: node.name for node in self.nodes}
        entries = self.manager.engine.get(f"/tasks?filters={_filters(service=[service])}")
        return [Task(id=entry["ID"], node=names.get(entry.get("NodeID", ""), ""),
                     slot=entry.get("Slot", 0), state=entry["Status"]["State"],
                     desired_state=entry["DesiredState"],
                     container_id=entry["Status"].get("ContainerStatus", {})
                     .get("ContainerID", ""))
                for entry in entries]

    def running_tasks(self, service: str) -> dict[str, list[Task]]:
        """The service's running tasks (meant to run, and running), by node name."""
        placed: dict[str, list[Task]] = {node.name: [] for node in self.nodes}
        for task in self.tasks(service):
            if task.state == task.desired_state == "running":
                placed[task.node].append(task)
        return placed

    def wait_running(self, service: str, replicas: int,
                     where: Callable[[dict[str, list[Task]]], bool] = lambda placed: True,
                     timeout: float = START_TIMEOUT) -> dict[str, list[Task]]:
        """Wait until exactly `replicas` tasks run, placed as `where` wants; by node name."""
        def converged() -> dict[str, list[Task]] | None:
            try:
                placed = self.running_tasks(service)
            except EngineError as e:  # a loaded manager's Raft store times out at times
                if "DeadlineExceeded" not in str(e):
                    raise
                return None
            count = sum(map(len, placed.values()))
            return placed if count == replicas and where(placed) else None

        return wait_for(converged, timeout, f"{replicas} running tasks of {service}",
                        lambda: self.docker("service", "ps", "--no-trunc", service))


def _comm(process: subprocess.Popen[bytes]) -> str:
    """The name of the program a process runs now ("" once it is gone)."""
    try:
        return Path(f"/proc/{process.pid}/comm").read_text().strip()
    except OSError:
        return ""


def _accepts(path: Path) -> bool:
    """Whether something accepts connections on the unix socket `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def _tail(path: Path, lines: int = 40) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return f"--- {path} ---\n" + "\n".join(text.splitlines()[-lines:])


def _make_dirs(nodes: Sequence[Node]) -> None:
    """The data roots' tmpfs; each node's /etc/docker, data and run directories, cgroups."""
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    sh("mount", "-t", "tmpfs", "-o", "mode=0710", "lab-swarm", DATA_DIR)
    root = CGROUP_MOUNT / CGROUP_NAME
    root.mkdir()
    (root / "cgroup.subtree_control").write_text(CONTROLLERS)
    for node in nodes:
        node.etc_docker.mkdir(parents=True, exist_ok=True)
        node.data_root.mkdir()
        node.run_dir.mkdir(parents=True)
        node.cgroup.parent.mkdir()
        (node.cgroup.parent / "cgroup.subtree_control").write_text(CONTROLLERS)
        node.cgroup.mkdir()
        node.system_cgroup.mkdir()
        (node.cgroup / "cpu.max").write_text(node.cpu_max)


def _set_link(name: str, state: str) -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname=name)[0], state=state)


def _each(nodes: Sequence[Node], action: Callable[[Node], T]) -> list[T]:
    """`action` on every node at once (threads: each waits on its engine)."""
    if not nodes:
        return []
    with ThreadPoolExecutor(len(nodes)) as pool:
        return list(pool.map(action, nodes))


def _filters(**filters: list[str]) -> str:
    return quote(json.dumps(filters))


def main(argv: list[str] | None = None) -> int:
    """Build a Swarm, show it and how long each step took, remove it."""
    parser = argparse.ArgumentParser(prog="python3 -m lab.swarm", description=main.__doc__)
    parser.parse_args(argv)
    swarm = Swarm(THREE_NODES).up()
    try:
        print(swarm.docker("node", "ls"))
        for node in swarm.nodes:
            print(f"{node.name}: {node.address}, socket {node.socket}, cgroup {node.cgroup} "
                  f"(cpu.max {node.cpu_max}), node ID {node.node_id}")
        print("timings:", ", ".join(f"{k} {v:.1f} s" for k, v in swarm.timings.items()))
        print(sh("free", "-m"))
    finally:
        swarm.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
