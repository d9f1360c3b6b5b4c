"""Swarm identities, and the mutual TLS of the channel between the nodes and the manager.

Swarm gives every node a certificate signed by the Swarm's root CA: its CN is the node's
ID, its OU the node's role (swarm-manager, swarm-worker), its O the Swarm's ID, and its
subject alternative names include the node's ID. dockerd keeps it, its key and the root
CA's certificate in DATA_ROOT/swarm/certificates (`docker info`: Docker Root Dir), renews
it before it expires, and Swarm forgets a node that is removed. The channel reuses them:
each end presents its node's certificate and accepts only a peer certificate that chains
to the Swarm's root CA. The manager takes a node's identity from its certificate alone,
never from what the node says; the agent checks that the manager's certificate names the
manager node it meant to reach (its ID, as Swarm lists its managers) and the manager role.

The key file carries Swarm's own PEM headers (kek-version, and a manager's raft-dek), which
OpenSSL takes for encryption headers: the key is loaded without them, from memory (a
memfd), never copied to disk. A Swarm with autolock keeps the key encrypted: it cannot be
used here.
"""

from __future__ import annotations

import os
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .protocol import reason

CERT_DIR = Path("swarm/certificates")  # under dockerd's data root
ROOT_CA = "swarm-root-ca.crt"
NODE_CERT = "swarm-node.crt"
NODE_KEY = "swarm-node.key"
ROLES = {"swarm-manager": "manager", "swarm-worker": "worker"}
NODE_ID = re.compile(r"^[a-z0-9]{25}$")  # Swarm's node IDs: 25 characters, base 36
MAX_KEY_BYTES = 64 * 1024


class IdentityError(Exception):
    """A certificate or key that cannot be used, or a peer that is not who it must be;
    a one-line message."""


@dataclass(frozen=True)
class Identity:
    """Who a Swarm certificate says its holder is."""

    node_id: str
    role: str  # manager, worker
    swarm_id: str


@dataclass(frozen=True)
class Credentials:
    """A node's Swarm certificate, key and root CA, in `directory` (dockerd's)."""

    directory: Path

    @classmethod
    def of_data_root(cls, data_root: Path) -> Credentials:
        return cls(data_root / CERT_DIR)

    @property
    def root_ca(self) -> Path:
        return self.directory / ROOT_CA

    @property
    def cert(self) -> Path:
        return self.directory / NODE_CERT

    @property
    def key(self) -> Path:
        return self.directory / NODE_KEY

    def version(self) -> tuple[int, ...]:
        """Changes when Swarm renews the certificate or rotates the CA (their mtimes)."""
        try:
            return tuple(p.stat().st_mtime_ns for p in (self.root_ca, self.cert, self.key))
        except OSError as e:
            raise IdentityError(f"no Swarm identity in {self.directory}: {e.strerror}") \
                from None

    def server_context(self) -> ssl.SSLContext:
        """The manager's end: its node's certificate; a client must present a certificate
        of the same Swarm."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.verify_mode = ssl.CERT_REQUIRED
        self._load(context)
        return context

    def client_context(self) -> ssl.SSLContext:
        """A node's end: its certificate; the server's must be of the same Swarm and name
        the manager asked for (its node ID as the server name: `connect_to`)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the server's name
        self._load(context)
        return context

    def _load(self, context: ssl.SSLContext) -> None:
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_verify_locations(cafile=str(self.root_ca))
        except (OSError, ssl.SSLError) as e:
            raise IdentityError(f"cannot load the Swarm's root CA {self.root_ca}: "
                                f"{reason(e)}") from None
        key = plain_key(_read(self.key, MAX_KEY_BYTES), self.key)
        fd = os.memfd_create("swarm-node-key", os.MFD_CLOEXEC)
        try:
            os.write(fd, key)
            context.load_cert_chain(str(self.cert), f"/proc/self/fd/{fd}")
        except (OSError, ssl.SSLError) as e:
            raise IdentityError(f"cannot load the node's certificate {self.cert} and its "
                                f"key: {reason(e)}") from None
        finally:
            os.close(fd)


def plain_key(pem: bytes, where: Path) -> bytes:
    """The PEM key without Swarm's headers; IdentityError if it is encrypted or no key."""
    lines = pem.splitlines()
    begin = [line for line in lines if line.startswith(b"-----BEGIN ")]
    if len(begin) != 1 or not begin[0].endswith(b"PRIVATE KEY-----"):
        raise IdentityError(f"{where} holds no private key")
    if b"ENCRYPTED" in begin[0] or any(line.startswith(b"Proc-Type:") for line in lines):
        raise IdentityError(f"{where} is encrypted (an autolocked Swarm): dqoes-cg cannot "
                            "use it")
    return b"".join(line + b"\n" for line in lines if b": " not in line and line.strip())


def peer_identity(cert: dict[str, Any] | None) -> Identity:
    """The identity in a verified peer certificate (`SSLSocket.getpeercert()`)."""
    if not cert:
        raise IdentityError("the peer presented no certificate")
    subject: dict[str, list[str]] = {}
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            subject.setdefault(key, []).append(value)
    cn, ou, o = (subject.get(k, []) for k in ("commonName", "organizationalUnitName",
                                              "organizationName"))
    if len(cn) != 1 or not NODE_ID.match(cn[0]):
        raise IdentityError(f"the peer's certificate names no Swarm node (CN {cn!r:.80})")
    if len(ou) != 1 or ou[0] not in ROLES:
        raise IdentityError(f"the peer's certificate gives no Swarm role (OU {ou!r:.80})")
    if len(o) != 1 or not o[0]:
        raise IdentityError("the peer's certificate names no Swarm (O)")
    return Identity(cn[0], ROLES[ou[0]], o[0])


def _read(path: Path, limit: int) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise IdentityError(f"cannot read {path}: {e.strerror}") from None
    if len(data) > limit:
        raise IdentityError(f"{path} is larger than {limit} bytes")
    return data

