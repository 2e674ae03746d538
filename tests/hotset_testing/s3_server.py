"""A real S3 server (MinIO, built by scripts/install-s3.sh) on loopback, for tests and benchmarks.

    with s3_server.running(tmp_path) as s3:
        s3.make_bucket("models")
        s3.upload_folder("models", "iris/", folder)   # with boto3, a real S3 client
        ...                                            # s3.endpoint, s3.access_key, s3.secret_key

Started with its own data folder and fresh root credentials, stopped by pid. MinIO's update
check, console and call-home are off: nothing leaves the machine.
"""
from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from hotset_testing.processes import Process, cache_dir, free_ports, spawn, wait_http

MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"  # scripts/install-s3.sh


class ServerMissing(RuntimeError):
    """The S3 server is not installed; `make install-s3` (scripts/install-s3.sh) builds it."""


def minio_binary() -> Path:
    cache = cache_dir()
    binary = cache / "tools" / f"minio-{MINIO_VERSION}" / "minio"
    if not binary.is_file():
        raise ServerMissing(f"{binary} is missing: run `make install-s3` (scripts/install-s3.sh builds MinIO "
                            "from the Go module proxy once per machine)")
    return binary


@dataclass
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    process: Process

    def client(self, **overrides: Any) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=overrides.get("access_key", self.access_key),
                            aws_secret_access_key=overrides.get("secret_key", self.secret_key),
                            config=Config(s3={"addressing_style": "path"}))

    def make_bucket(self, bucket: str, public: bool = False) -> None:
        client = self.client()
        client.create_bucket(Bucket=bucket)
        if public:  # anonymous reads of its objects (a public model bucket)
            import json

            policy = {"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"AWS": ["*"]},
                "Action": ["s3:GetObject", "s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]}
            client.put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy))

    def upload_folder(self, bucket: str, prefix: str, folder: Path) -> int:
        """Upload every file under `folder` to ``bucket/prefix<relative path>``; the bytes uploaded."""
        client = self.client()
        total = 0
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            client.upload_file(str(path), bucket, prefix + path.relative_to(folder).as_posix())
            total += path.stat().st_size
        return total

    def credential_files(self, folder: Path, secret: str, namespace: str = "") -> Path:
        """Write this server's keys as a mounted Secret would hold them (worker --source-credentials)."""
        from hotset_common.sources import credential_key

        folder.mkdir(parents=True, exist_ok=True)
        (folder / credential_key(namespace, secret, "AWS_ACCESS_KEY_ID")).write_text(self.access_key)
        (folder / credential_key(namespace, secret, "AWS_SECRET_ACCESS_KEY")).write_text(self.secret_key)
        return folder


@contextlib.contextmanager
def running(workdir: Path) -> Iterator[S3Server]:
    binary = minio_binary()
    port, console = free_ports(2)
    data = workdir / "s3-data"
    data.mkdir(parents=True, exist_ok=True)
    access_key, secret_key = "hotset" + secrets.token_hex(4), secrets.token_hex(16)
    env = {**os.environ, "MINIO_ROOT_USER": access_key, "MINIO_ROOT_PASSWORD": secret_key,
           "MINIO_BROWSER": "off", "MINIO_UPDATE": "off", "MINIO_CALLHOME_ENABLE": "off",
           "HOME": str(workdir)}
    argv = [str(binary), "server", str(data), "--address", f"127.0.0.1:{port}",
            "--console-address", f"127.0.0.1:{console}", "--quiet"]
    endpoint = f"http://127.0.0.1:{port}"
    with spawn("minio", argv, workdir / "minio.log", env=env, url=endpoint) as process:
        wait_http(process, "/minio/health/live", 60)
        yield S3Server(endpoint, access_key, secret_key, process)
