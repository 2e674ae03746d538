"""A real OCI registry (the CNCF distribution registry, built by scripts/install-registry.sh) on loopback.

    with oci_registry.running(tmp_path) as registry:
        registry.push_folder("models/sentiment:v1", folder)   # an ORAS artifact, one layer per file
        registry.push_image("models/iris:v1", [layer_tar_gz]) # an image: tar+gzip layers, no titles
        registry.blob_gets("models/sentiment")                 # GETs of its blobs, from the access log

    with oci_registry.running(tmp_path, users={"puller": "s3cret"}) as registry:  # htpasswd auth
        registry.credential_files(folder, "regcred", "puller", "s3cret")  # a .dockerconfigjson Secret's file

Pushed with oras-py, the client the worker pulls with. Started with its own storage folder on a
free port over plain http, stopped by pid. With `users`, the registry's own htpasswd access
controller asks for basic authentication on every request (the file is written with bcrypt
hashes, the one format it reads, by the C library's crypt(3)), and pushes sign in as the first user.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from hotset_testing.processes import Process, cache_dir, free_port, spawn, wait_http

REGISTRY_VERSION = "v3.1.2"  # scripts/install-registry.sh
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_GZIP_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"


class RegistryMissing(RuntimeError):
    """The registry is not built; scripts/install-registry.sh builds it."""


def registry_binary() -> Path:
    cache = cache_dir()
    binary = cache / "tools" / f"registry-{REGISTRY_VERSION}" / "registry"
    if not binary.is_file():
        raise RegistryMissing(f"{binary} is missing: run scripts/install-registry.sh (it builds the distribution "
                              "registry from the Go module proxy once per machine)")
    return binary


@dataclass
class Registry:
    host: str  # 127.0.0.1:port, as an oci:// URI names it
    process: Process
    users: dict[str, str] = field(default_factory=dict)  # htpasswd users and passwords; empty: open

    def client(self):  # noqa: ANN201 - oras.client.OrasClient
        import oras.client

        if not self.users:
            return oras.client.OrasClient(hostname=self.host, insecure=True)
        client = oras.client.OrasClient(hostname=self.host, insecure=True, auth_backend="basic")
        client.auth.set_basic_auth(*next(iter(self.users.items())))  # not login(): it writes ~/.docker
        return client

    def docker_config(self, user: str, password: str, host: str | None = None) -> str:
        """A ``.dockerconfigjson`` as a ``kubernetes.io/dockerconfigjson`` Secret holds it (``auth``:
        base64 of user:password), for `host` (default: this registry)."""
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        return json.dumps({"auths": {host or self.host: {"auth": token}}})

    def credential_files(self, folder: Path, secret: str, user: str, password: str, host: str | None = None) -> Path:
        """Write that Secret's key as the worker's mounted credentials hold it (--source-credentials)."""
        from hotset_common.sources import DOCKER_CONFIG_KEYS, credential_key

        folder.mkdir(parents=True, exist_ok=True)
        (folder / credential_key("", secret, DOCKER_CONFIG_KEYS[0])).write_text(self.docker_config(user, password, host))
        return folder

    def push_folder(self, target: str, folder: Path) -> str:
        """Push every file directly in `folder` as an ORAS artifact (titled layers); its manifest digest."""
        files = sorted(str(p) for p in Path(folder).iterdir() if p.is_file())
        response = self.client().push(target=f"{self.host}/{target}", files=files, disable_path_validation=True,
                                      quiet=True)
        return _digest_of(response)

    def push_image(self, target: str, layers: list[Path]) -> str:
        """Push an OCI image whose `layers` (tar+gzip files) carry no titles; its manifest digest."""
        import oras.oci

        registry = self.client()
        container = registry.get_container(f"{self.host}/{target}")
        manifest = oras.oci.NewManifest()
        for path in layers:
            layer = oras.oci.NewLayer(str(path), media_type=LAYER_GZIP_TYPE)
            layer.pop("annotations", None)
            registry._check_200_response(registry.upload_blob(str(path), container, layer))
            manifest["layers"].append(layer)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as config:
            json.dump({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}, config)
        try:
            conf = {"mediaType": CONFIG_TYPE, "size": os.path.getsize(config.name),
                    "digest": "sha256:" + hashlib.sha256(Path(config.name).read_bytes()).hexdigest()}
            registry._check_200_response(registry.upload_blob(config.name, container, conf))
        finally:
            os.unlink(config.name)
        manifest["config"] = conf
        response = registry.upload_manifest(manifest, container)
        registry._check_200_response(response)
        return _digest_of(response)

    def blob_gets(self, repository: str) -> int:
        """How many GETs of `repository`'s blobs the registry has answered (its access log)."""
        pattern = re.compile(rf'"GET /v2/{re.escape(repository)}/blobs/sha256:[0-9a-f]{{64}} ')
        return sum(1 for line in self.process.log().splitlines() if pattern.search(line))


def _digest_of(response) -> str:  # noqa: ANN001 - requests.Response of a manifest PUT
    return response.headers["Docker-Content-Digest"]


def htpasswd(users: dict[str, str]) -> str:
    """An htpasswd file's lines, bcrypt-hashed (cost 4, the least bcrypt allows: the registry checks
    the hash on every request) by the C library's crypt(3), which Python's crypt module calls."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # removed in 3.13; the project runs 3.11
        import crypt

    lines = []
    for user, password in users.items():
        hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))
        if not hashed or not hashed.startswith("$2"):
            raise RuntimeError("this C library's crypt(3) makes no bcrypt hashes, the registry's htpasswd format")
        lines.append(f"{user}:{hashed}\n")
    return "".join(lines)


@contextlib.contextmanager
def running(workdir: Path, users: dict[str, str] | None = None) -> Iterator[Registry]:
    binary = registry_binary()
    port = free_port()
    storage = workdir / "registry-data"
    storage.mkdir(parents=True, exist_ok=True)
    settings: dict = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": False}},
        "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}", "debug": {"addr": ""}},
    }
    if users:
        passwords = workdir / "htpasswd"
        passwords.write_text(htpasswd(users))
        settings["auth"] = {"htpasswd": {"realm": "hotset-test-registry", "path": str(passwords)}}
    config = workdir / "registry.yml"
    config.write_text(json.dumps(settings))  # YAML is a superset of JSON
    env = {"OTEL_TRACES_EXPORTER": "none", "HOME": str(workdir)}
    with spawn("registry", [str(binary), "serve", str(config)], workdir / "registry.log", env=env,
               url=f"http://127.0.0.1:{port}") as process:
        wait_http(process, "/v2/", 60, expect=401 if users else 200)
        yield Registry(f"127.0.0.1:{port}", process, dict(users or {}))
