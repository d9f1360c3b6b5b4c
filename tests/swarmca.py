"""Swarm-like identities for tests on the host, made with the openssl command: a root CA
(CN swarm-ca) and node certificates as Swarm issues them (EC P-256; subject O=Swarm ID,
OU=swarm-manager or swarm-worker, CN=node ID; DNS names the role and the node ID; server
and client use), each in a directory laid out as dockerd's swarm/certificates, the key
with Swarm's PEM header (kek-version)."""

from __future__ import annotations

import secrets
import string
import subprocess
from pathlib import Path

from dqoes_cg.cluster.identity import NODE_CERT, NODE_KEY, ROOT_CA, Credentials

_ALPHABET = string.ascii_lowercase + string.digits


def swarm_id() -> str:
    """An ID as Swarm makes them: 25 characters of base 36."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(25))


def _openssl(*args: str | Path, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["openssl", *map(str, args)], input=stdin, check=True,
                          capture_output=True).stdout


class SwarmCA:
    """A Swarm's root CA in `directory`."""

    def __init__(self, directory: Path, swarm: str | None = None) -> None:
        self.directory = directory
        self.swarm = swarm or swarm_id()
        directory.mkdir(parents=True, exist_ok=True)
        self.key = directory / "ca.key"
        self.cert = directory / ROOT_CA
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", self.key)
        _openssl("req", "-x509", "-new", "-key", self.key, "-subj", "/CN=swarm-ca", "-days",
                 "2", "-out", self.cert, "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def node(self, name: str, role: str = "worker", node: str | None = None,
             swarm: str | None = None) -> tuple[str, Credentials]:
        """A node's certificates in DIRECTORY/name (role: manager or worker); its ID."""
        node = node or swarm_id()
        where = self.directory / name
        where.mkdir()
        key = where / "plain.key"
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", where / "ec.key")
        _openssl("pkcs8", "-topk8", "-nocrypt", "-in", where / "ec.key", "-out", key)
        csr = _openssl("req", "-new", "-key", key, "-subj",
                       f"/O={swarm or self.swarm}/OU=swarm-{role}/CN={node}")
        extensions = where / "ext.cnf"
        extensions.write_text(f"subjectAltName=DNS:swarm-{role},DNS:{node}\n"
                              "extendedKeyUsage=serverAuth,clientAuth\n"
                              "keyUsage=critical,digitalSignature,keyEncipherment\n")
        cert = _openssl("x509", "-req", "-CA", self.cert, "-CAkey", self.key,
                        "-CAcreateserial", "-days", "2", "-extfile", extensions, stdin=csr)
        (where / NODE_CERT).write_bytes(cert)
        (where / ROOT_CA).write_bytes(self.cert.read_bytes())
        lines = key.read_bytes().splitlines(keepends=True)
        (where / NODE_KEY).write_bytes(lines[0] + b"kek-version: 0\n\n" + b"".join(lines[1:]))
        key.unlink()
        return node, Credentials(where)
