"""Certificates and keys for a throw-away control plane, made with the openssl CLI.

kube-apiserver needs a serving certificate, a client CA (the admin and the
other components authenticate with client certificates) and a key pair to
sign service-account tokens. The openssl binary is on every Debian machine,
so no extra Python package is needed.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, text=True)


def _issue(directory: Path, name: str, subject: str, extensions: str) -> None:
    """Sign a fresh key pair `name` with the CA in `directory`."""
    ext_file = directory / f"{name}.ext"
    ext_file.write_text(extensions)
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-subj", subject, "-out", f"{name}.csr", cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-sha256", "-extfile", ext_file.name,
             "-out", f"{name}.crt", cwd=directory)


def create(directory: Path) -> Pki:
    """Write a CA, a 127.0.0.1 serving cert, an admin client cert and SA keys."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "2", "-subj", "/CN=hotset-test-ca", cwd=directory)
    _issue(directory, "apiserver", "/CN=kube-apiserver",
           "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
           "extendedKeyUsage=serverAuth\n"
           "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
           "DNS:kubernetes.default.svc,IP:10.0.0.1\n")
    # system:masters is the built-in superuser group: the test's and the components' identity.
    _issue(directory, "admin", "/O=system:masters/CN=hotset-admin",
           "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
           "extendedKeyUsage=clientAuth\n")
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    return Pki(
        ca_cert=directory / "ca.crt", ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt", serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt", admin_key=directory / "admin.key",
        sa_key=directory / "sa.key", sa_pub=directory / "sa.pub",
    )
