"""Certificates for the TLS tests, made with the ``openssl`` command line: a CA, a
server certificate for 127.0.0.1 and localhost, a client certificate, and a
second CA that signed none of them (plus a client certificate of its own).

They live in a directory of Mosquitto's own under /tmp
(``tests.mosquitto.persistence_dir``): started as root, mosquitto drops to its
user before it reads the server's key. Dovecot and Radicale, started as root,
read them from there too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.mosquitto import persistence_dir

OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"
OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


# -- certificates ---------------------------------------------------------------


def hand_over(path: Path, private: bool = False) -> Path:
    """Give a file to the owner of its directory (mosquitto, when we are root)."""
    st = path.parent.stat()
    if os.geteuid() == 0:
        os.chown(path, st.st_uid, st.st_gid)
    path.chmod(0o600 if private else 0o644)
    return path


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path           # a CA of its own, that signed nothing the broker has
    other_client_cert: Path  # signed by other_ca
    other_client_key: Path


class _OpenSsl:
    def __init__(self, where: Path) -> None:
        self.where = where
        self.cnf = where / "openssl.cnf"
        self.cnf.write_text(OPENSSL_CNF)
        self.serial = 1000

    def run(self, *args: str) -> None:
        done = subprocess.run([OPENSSL, *args], cwd=self.where, capture_output=True,
                              text=True, check=False)
        assert done.returncode == 0, f"openssl {args[0]} failed: {done.stderr}"

    def ca(self, name: str, cn: str) -> None:
        self.run("req", "-config", str(self.cnf), "-x509", "-new", "-newkey", "ec",
                 "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
                 "-subj", f"/CN={cn}", "-extensions", "ca_ext")

    def leaf(self, name: str, cn: str, ca: str, ext: str) -> None:
        self.run("req", "-config", str(self.cnf), "-new", "-newkey", "ec",
                 "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}")
        self.serial += 1
        self.run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt",
                 "-CAkey", f"{ca}.key", "-set_serial", str(self.serial), "-days", "2",
                 "-out", f"{name}.crt", "-extfile", str(self.cnf), "-extensions", ext)


@contextmanager
def made_pki() -> Iterator[Pki]:
    """Make the certificates; removed on exit."""
    assert Path(OPENSSL).exists(), "the openssl command line is needed"
    where = persistence_dir()  # mosquitto's own: it reads the server's key from here
    try:
        ssl = _OpenSsl(where)
        ssl.ca("ca", "Reverie test CA")
        ssl.ca("other-ca", "Some other CA")
        ssl.leaf("server", "127.0.0.1", "ca", "server_ext")
        ssl.leaf("client", "reverie-bridge", "ca", "client_ext")
        ssl.leaf("other-client", "reverie-bridge", "other-ca", "client_ext")
        for crt in where.glob("*.crt"):
            hand_over(crt)
        for key in where.glob("*.key"):
            hand_over(key, private=True)
        yield Pki(where, where / "ca.crt", where / "server.crt", where / "server.key",
                  where / "client.crt", where / "client.key", where / "other-ca.crt",
                  where / "other-client.crt", where / "other-client.key")
    finally:
        shutil.rmtree(where, ignore_errors=True)
