"""https:// (and an explicitly allowed http://) archives: one download checked against its sha256,
unpacked only when it matches, nothing unpacked outside the model's folder. The archive host is a
real HTTP server on loopback (the standard library's)."""
from __future__ import annotations

import contextlib
import hashlib
import http.server
import io
import tarfile
import threading
import zipfile
from pathlib import Path
from typing import Iterator

import pytest

from hotset_common import errors
from hotset_common.spec import ModelSpec
from hotset_testing.processes import free_port
from hotset_worker.sources.cache import ContentCache
from hotset_worker.sources.fetcher import SourceFetcher


class _Files(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}
    lie_about_length: set[str] = set()  # paths answered with a Content-Length longer than the body
    redirects: dict[str, str] = {}  # paths answered with a 302 to another URL

    def _answer(self, body: bool) -> None:
        if self.path in self.redirects:
            self.send_response(302)
            self.send_header("Location", self.redirects[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        content = self.files.get(self.path)
        if content is None:
            self.send_error(404)
            return
        self.send_response(200)
        length = len(content) + (1000 if self.path in self.lie_about_length else 0)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if body:
            self.wfile.write(content)
            self.close_connection = True

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(body=True)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _serving(files: dict[str, bytes]) -> Iterator[str]:
    _Files.files = files
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _tar_gz(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return out.getvalue()


def _zip(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return out.getvalue()


MODEL = {"iris/config.pbtxt": b'name: "iris"\n', "iris/1/model.onnx": b"\x08\x07" * 50_000}
GOOD_TAR = _tar_gz(MODEL)
GOOD_ZIP = _zip(MODEL)
EVIL_TAR = _tar_gz({"ok.txt": b"fine", "../../outside.txt": b"escaped"})


@pytest.fixture(scope="module")
def host():
    with _serving({"/iris.tar.gz": GOOD_TAR, "/iris.zip": GOOD_ZIP, "/evil.tar.gz": EVIL_TAR,
                   "/short.tar.gz": GOOD_TAR}) as url:
        _Files.lie_about_length = {"/short.tar.gz"}
        _Files.redirects = {"/moved.tar.gz": f"{url}/iris.tar.gz"}  # to plain http: leaves TLS
        yield url


def _fetch(tmp_path: Path, uri: str, sha256: str) -> Path:
    fetcher = SourceFetcher(ContentCache(tmp_path / "cache", 2**30))
    spec = ModelSpec(id="m", framework="triton", source=uri, source_options={"sha256": sha256})
    return fetcher.folder(spec)


def _leftovers(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "cache" / "tmp").iterdir())


@pytest.mark.parametrize("name, content", [("iris.tar.gz", GOOD_TAR), ("iris.zip", GOOD_ZIP)])
def test_a_matching_archive_is_unpacked_into_the_cache(host, tmp_path, name, content) -> None:
    folder = _fetch(tmp_path, f"{host}/{name}", hashlib.sha256(content).hexdigest())
    assert (folder / "iris" / "1" / "model.onnx").read_bytes() == MODEL["iris/1/model.onnx"]
    assert not (folder / ".download").exists()  # the archive itself is not kept


def test_a_checksum_mismatch_fails_naming_both_digests_and_keeps_nothing(host, tmp_path) -> None:
    wrong = "0" * 64
    with pytest.raises(errors.ModelLoadFailed, match=rf"iris.tar.gz.*sha256 mismatch.*{hashlib.sha256(GOOD_TAR).hexdigest()}.*{wrong}"):
        _fetch(tmp_path, f"{host}/iris.tar.gz", wrong)
    assert _leftovers(tmp_path) == [] and not any((tmp_path / "cache" / "entries").iterdir())


def test_a_truncated_download_fails_and_keeps_nothing(host, tmp_path) -> None:
    with pytest.raises(errors.ModelLoadFailed, match=r"short.tar.gz.*(interrupted|truncated)"):
        _fetch(tmp_path, f"{host}/short.tar.gz", hashlib.sha256(GOOD_TAR).hexdigest())
    assert _leftovers(tmp_path) == []


def test_an_archive_member_outside_the_folder_is_refused(host, tmp_path) -> None:
    with pytest.raises(errors.ModelLoadFailed, match=r"'\.\./\.\./outside\.txt' would be written outside"):
        _fetch(tmp_path, f"{host}/evil.tar.gz", hashlib.sha256(EVIL_TAR).hexdigest())
    assert not (tmp_path / "outside.txt").exists() and not (tmp_path / "cache" / "outside.txt").exists()
    assert _leftovers(tmp_path) == []


def test_a_redirect_to_plain_http_is_refused_naming_where_it_led(host, tmp_path) -> None:
    with pytest.raises(errors.ModelLoadFailed, match=rf"moved\.tar\.gz.*redirected to '{host}/iris\.tar\.gz', which is "
                       r"not https"):
        _fetch(tmp_path, f"{host}/moved.tar.gz", hashlib.sha256(GOOD_TAR).hexdigest())
    assert _leftovers(tmp_path) == [] and not any((tmp_path / "cache" / "entries").iterdir())


def test_a_missing_archive_is_named(host, tmp_path) -> None:
    with pytest.raises(errors.ModelLoadFailed, match=r"gone.tar.gz.*not found \(404"):
        _fetch(tmp_path, f"{host}/gone.tar.gz", "1" * 64)


def test_a_cached_archive_loads_without_a_request_even_from_another_mirror(host, tmp_path) -> None:
    digest = hashlib.sha256(GOOD_TAR).hexdigest()
    first = _fetch(tmp_path, f"{host}/iris.tar.gz", digest)
    dead = f"http://127.0.0.1:{free_port()}/mirror/iris.tar.gz"  # nothing listens there
    assert _fetch(tmp_path, dead, digest) == first  # keyed by its sha256: a hit, no request made
