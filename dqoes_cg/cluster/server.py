"""The manager's end of the channel: a TLS listener, and a thread per node's agent.

A connection is served only after its TLS handshake (within HANDSHAKE_TIMEOUT_S) proved a
certificate of this Swarm (identity.py) for a node that Swarm still has. The node's
identity is that certificate's node ID; a node that connects again replaces its previous
connection. Each connection's thread answers the node's reports (manager.py judges them),
sends the node its services' labels whenever they change, and ends the connection when
the node breaks the protocol or stays silent for IDLE_TIMEOUT_S. A node's next report is
read no sooner than the manager takes it (Manager.report_due): one that sends faster than
it is asked is slowed by its own connection's flow control. At most MAX_CONNECTIONS
connections at once; the server's certificate is loaded again when Swarm renews it. What a
peer's connections make it log is at most a line a minute per peer.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time

from ..logs import RateLimitedLog
from .identity import Credentials, IdentityError, peer_identity
from .manager import Manager
from .protocol import Channel, ProtocolError, Report, Services, reason

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
SEND_TIMEOUT_S = 5.0
POLL_S = 1.0  # how often a connection looks for labels to send (a tick's time)
IDLE_TIMEOUT_S = 30.0  # three of the longest report interval asked (pace.MAX_INTERVAL_S)
MAX_CONNECTIONS = 1024


class Server:
    """Serves the nodes' agents on `address` for `manager`, as a node of Swarm `swarm_id`."""

    def __init__(self, manager: Manager, credentials: Credentials, swarm_id: str,
                 address: tuple[str, int]) -> None:
        self.manager = manager
        self.credentials = credentials
        self.swarm_id = swarm_id
        self._version = credentials.version()
        self._context = credentials.server_context()
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._listener = socket.create_server(address, family=family, backlog=128)
        self._listener.settimeout(POLL_S)
        self.address = self._listener.getsockname()[:2]
        self._stopping = threading.Event()
        self._per_peer = RateLimitedLog(log)  # anyone may connect, a node reconnect in a loop
        self._lock = threading.Lock()
        self._current: dict[str, threading.Event] = {}  # node ID: its connection's "replaced"
        self._threads: set[threading.Thread] = set()
        self._acceptor = threading.Thread(target=self._accept, name="dqoes-accept",
                                          daemon=True)

    def start(self) -> None:
        self._acceptor.start()

    def close(self) -> None:
        self._stopping.set()
        self._acceptor.join()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join()
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as e:  # e.g. out of descriptors: this one is lost, go on
                self._per_peer.log(logging.WARNING, "accept",
                                   "accepting a node's connection failed: %s",
                                   e.strerror or e)
                self._stopping.wait(POLL_S)
                continue
            with self._lock:
                if len(self._threads) >= MAX_CONNECTIONS:
                    conn.close()
                    continue
                thread = threading.Thread(target=self._serve, args=(conn, peer[0]),
                                          name=f"dqoes-node-{peer[0]}", daemon=True)
                self._threads.add(thread)
            thread.start()

    def _tls_context(self) -> ssl.SSLContext:
        """The server's context, loaded again if Swarm renewed the certificate."""
        try:
            version = self.credentials.version()
            if version != self._version:
                self._context = self.credentials.server_context()
                self._version = version
                log.info("the node's Swarm certificate changed: loaded again")
        except IdentityError as e:
            log.warning("%s; keeping the certificate loaded before", e)
        return self._context

    def _serve(self, conn: socket.socket, peer: str) -> None:
        node_id, channel, replaced = None, None, None
        try:
            conn.settimeout(HANDSHAKE_TIMEOUT_S)
            tls = self._tls_context().wrap_socket(conn, server_side=True)
            channel = Channel(tls)
            identity = peer_identity(tls.getpeercert())
            if identity.swarm_id != self.swarm_id:
                raise IdentityError(f"a certificate of another Swarm ({identity.swarm_id})")
            if not self.manager.is_node(identity.node_id):
                raise IdentityError(f"node {identity.node_id} is not in the Swarm (removed?)")
            node_id = identity.node_id
            replaced = threading.Event()
            with self._lock:
                previous = self._current.get(node_id)
                self._current[node_id] = replaced
            if previous is not None:
                previous.set()
            self.manager.connected(node_id)
            self._per_peer.log(logging.INFO, node_id, "node %s (%s, %s) connected",
                               node_id, identity.role, peer)
            self._converse(node_id, channel, replaced)
        except (OSError, ssl.SSLError, IdentityError, ProtocolError, ConnectionError) as e:
            self._per_peer.log(logging.INFO, peer, "connection from %s%s ended: %s", peer,
                               f" (node {node_id})" if node_id else "", reason(e))
        except Exception:  # a bug must end this connection only
            log.exception("connection from %s failed", peer)
        finally:
            if channel is not None:
                channel.close()
            else:
                conn.close()
            with self._lock:
                self._threads.discard(threading.current_thread())
                if node_id is not None and self._current.get(node_id) is replaced:
                    del self._current[node_id]
                    self.manager.disconnected(node_id)

    def _converse(self, node_id: str, channel: Channel, replaced: threading.Event) -> None:
        sent: dict[str, dict[str, str]] | None = None
        heard = time.monotonic()
        while not (self._stopping.is_set() or replaced.is_set()):
            services = self.manager.services_for(node_id)
            if services != sent:
                channel.send(Services(services), SEND_TIMEOUT_S)
                sent = services
            early = self.manager.report_due(node_id) - time.monotonic()
            if early > 0:
                replaced.wait(min(early, POLL_S))
                continue
            message = channel.receive(POLL_S)
            now = time.monotonic()
            if message is None:
                if now - heard > IDLE_TIMEOUT_S:
                    raise TimeoutError(f"no report for {IDLE_TIMEOUT_S:.0f} s")
                continue
            if not isinstance(message, Report):
                raise ProtocolError(f"a node sent a {type(message).__name__} message")
            heard = now
            channel.send(self.manager.receive(node_id, message, now), SEND_TIMEOUT_S)

