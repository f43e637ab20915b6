"""The household's certificates and Ray token for a cluster (``reverie cluster``).

A household's cluster has its own certificate authority: ``reverie cluster
init`` on the hub makes it (an ECDSA P-256 key, ten years), the hub's node
certificate, and the household's Ray token, all in the cluster directory
(``[cluster] dir``, default ``<data dir>/cluster``: a 0700 directory, every
file 0600). ``reverie cluster issue IP --out DIR`` makes a helper's bundle:
the CA's certificate (not its key), a node certificate for the helper's
address, and the token; it is copied to the helper's cluster directory by
hand (``scp``), so nothing secret crosses the network in the clear.

A node certificate is both the node's server certificate and its client
certificate (Ray's gRPC asks every caller for one when ``RAY_TLS_CA_CERT`` is
set): its extended key usage says both, and its subject names the node's
address (and loopback, which Ray's own processes on the node use).
:func:`check` says what is missing or wrong, in words, for ``reverie run
--cluster`` and ``reverie join`` to refuse with.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from runtime.config import Settings

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
NODE_CERT = "node.crt"
NODE_KEY = "node.key"
TOKEN = "token"
CA_DAYS = 3650
NODE_DAYS = 825
# Ray refuses tokens it cannot read as one; 32 random bytes, URL-safe text.
TOKEN_BYTES = 32


class ClusterSecurityError(RuntimeError):
    """The cluster's certificates or token are missing or unusable (the message says which)."""


@dataclass(frozen=True)
class ClusterFiles:
    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / CA_CERT

    @property
    def ca_key(self) -> Path:
        return self.dir / CA_KEY

    @property
    def node_cert(self) -> Path:
        return self.dir / NODE_CERT

    @property
    def node_key(self) -> Path:
        return self.dir / NODE_KEY

    @property
    def token(self) -> Path:
        return self.dir / TOKEN


def cluster_files(settings: Settings) -> ClusterFiles:
    configured = settings.cluster.dir
    return ClusterFiles(configured.expanduser() if configured is not None
                        else settings.store.resolved_dir / "cluster")


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Reverie household"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def make_ca(files: ClusterFiles) -> None:
    """The household's CA (refuses to replace one: every node's certificate hangs on it)."""
    if files.ca_key.exists() or files.ca_cert.exists():
        raise ClusterSecurityError(f"{files.dir} has a CA already; remove it by hand to"
                                   " start over (every node then needs a new certificate)")
    _private_dir(files.dir)
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("Reverie household CA")
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    _write_private(files.ca_key, _key_pem(key))
    _write_private(files.ca_cert, cert.public_bytes(serialization.Encoding.PEM))


def make_token(files: ClusterFiles) -> None:
    """The household's Ray token, unless there is one."""
    _private_dir(files.dir)
    if not files.token.exists():
        _write_private(files.token, secrets.token_urlsafe(TOKEN_BYTES).encode())


def _load_ca(files: ClusterFiles) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    if not files.ca_key.exists():
        raise ClusterSecurityError(f"no CA key in {files.dir}: run `reverie cluster init`"
                                   " on the hub first")
    key = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ClusterSecurityError(f"{files.ca_key} is not the CA's EC key")
    return x509.load_pem_x509_certificate(files.ca_cert.read_bytes()), key


def issue_node(files: ClusterFiles, node_ip: str, out: ClusterFiles) -> None:
    """A node certificate for ``node_ip`` signed by the household's CA, written with
    the CA's certificate and the token into ``out`` (the hub's own dir, or a helper's
    bundle)."""
    address = ipaddress.ip_address(node_ip)
    ca_cert, ca_key = _load_ca(files)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    names: list[x509.GeneralName] = [x509.IPAddress(address),
                                     x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                     x509.DNSName("localhost")]
    cert = (x509.CertificateBuilder().subject_name(_name(f"Reverie node {node_ip}"))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=NODE_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=True,
                data_encipherment=False, key_agreement=False, key_cert_sign=False,
                crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _private_dir(out.dir)
    if out.dir != files.dir:
        _write_private(out.ca_cert, files.ca_cert.read_bytes())
        _write_private(out.token, files.token.read_bytes())
    _write_private(out.node_key, _key_pem(key))
    _write_private(out.node_cert, cert.public_bytes(serialization.Encoding.PEM))


def _owner_only(path: Path) -> str | None:
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        return f"{path} is not a file of this user's"
    if info.st_mode & 0o077:
        return f"{path} is readable by others (mode {info.st_mode & 0o777:o}); chmod 600 it"
    return None


def check(files: ClusterFiles, node_ip: str | None = None) -> None:
    """Raise :class:`ClusterSecurityError` with the reason unless the node can run
    with Ray's token auth and TLS: the CA's certificate, this node's certificate
    and key, and the token, each present and owner-only; the node certificate
    signed by that CA, valid now, for ``node_ip`` (when given); the token not empty."""
    if not files.dir.is_dir():
        raise ClusterSecurityError(f"no cluster directory {files.dir}: run `reverie cluster"
                                   " init` on the hub (or copy a helper's bundle there)")
    for path, what in ((files.ca_cert, "the household CA's certificate"),
                       (files.node_cert, "this node's certificate"),
                       (files.node_key, "this node's key"), (files.token, "the Ray token")):
        if not path.exists():
            raise ClusterSecurityError(f"{what} is missing ({path}): TLS between nodes and"
                                       " Ray's token auth are both required")
        if (problem := _owner_only(path)) is not None:
            raise ClusterSecurityError(problem)
    if not files.token.read_text().strip():
        raise ClusterSecurityError(f"the Ray token {files.token} is empty")
    try:
        ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
        cert = x509.load_pem_x509_certificate(files.node_cert.read_bytes())
        key = serialization.load_pem_private_key(files.node_key.read_bytes(), password=None)
    except ValueError as exc:
        raise ClusterSecurityError(f"unreadable certificate or key in {files.dir}: {exc}"
                                   ) from None
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, Exception) as exc:
        raise ClusterSecurityError(f"{files.node_cert} is not signed by the household CA"
                                   f" ({type(exc).__name__})") from None
    if key.public_key().public_bytes(serialization.Encoding.DER,
                                     serialization.PublicFormat.SubjectPublicKeyInfo) != \
            cert.public_key().public_bytes(serialization.Encoding.DER,
                                           serialization.PublicFormat.SubjectPublicKeyInfo):
        raise ClusterSecurityError(f"{files.node_key} is not the key of {files.node_cert}")
    now = _now()
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise ClusterSecurityError(f"{files.node_cert} is not valid now (valid "
                                   f"{cert.not_valid_before_utc:%Y-%m-%d} to "
                                   f"{cert.not_valid_after_utc:%Y-%m-%d})")
    if node_ip:
        ips = cert.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)
        if ipaddress.ip_address(node_ip) not in ips:
            raise ClusterSecurityError(f"{files.node_cert} is not for {node_ip} (it names "
                                       f"{', '.join(map(str, ips))}); issue one with "
                                       f"`reverie cluster issue {node_ip}`")
