"""A stand-in for the Hugging Face hub: the file-resolution endpoints huggingface_hub uses, on loopback.

No hub is reachable from these machines, so tests serve repositories in the
hub's layout from this small server and point the real ``huggingface_hub``
client at it with ``HF_ENDPOINT`` (the worker's ``--hf-endpoint``), exactly
as a pool points at a mirror. What it implements, as the hub answers it:

- ``GET /api/models/{repo}/revision/{revision}``: the repository's commit
  (``sha``) and files (``siblings``: ``rfilename``, ``size``), for
  ``HfApi.model_info``; 404 with ``X-Error-Code: RepoNotFound`` /
  ``RevisionNotFound``, 401 without the repository's token.
- ``HEAD`` and ``GET /{repo}/resolve/{revision}/{file}``: the file, with
  ``X-Repo-Commit``, ``ETag`` and ``Content-Length``, for ``hf_hub_download``;
  404 with ``X-Error-Code: EntryNotFound``.

A revision is a branch (moved with ``push``) or a commit. ``requests`` counts
what was asked; files named in ``cut`` have every body cut short halfway (an
interrupted download, which the client's own retries resume with ``Range``
and cannot finish); ``Range: bytes=N-`` is answered as the hub does (206).
"""
from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse


@dataclass
class _Repo:
    token: str = ""  # required bearer token; empty: public
    branches: dict[str, str] = field(default_factory=dict)  # branch -> commit
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> {file: content}


class HubStandIn:
    def __init__(self) -> None:
        self.repos: dict[str, _Repo] = {}
        self.requests: Counter[str] = Counter()  # "info repo@rev", "GET repo/file", "HEAD repo/file"
        self.cut: set[str] = set()  # files whose bodies are cut short halfway, every time
        self._lock = threading.Lock()
        self.app = self._build()

    def push(self, repo_id: str, folder: Path, branch: str = "main", token: str = "") -> str:
        """Commit every file under `folder` to `branch` of `repo_id`; the new commit's sha."""
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        digest = hashlib.sha1()
        for name, content in files.items():
            digest.update(name.encode() + b"\0" + hashlib.sha1(content).digest())
        commit = digest.hexdigest()
        with self._lock:
            repo = self.repos.setdefault(repo_id, _Repo(token=token))
            repo.commits[commit] = files
            repo.branches[branch] = commit
        return commit

    # ----- the endpoints -------------------------------------------------

    def _resolve(self, request: Request, repo_id: str, revision: str) -> tuple[str, dict[str, bytes]] | Response:
        repo = self.repos.get(repo_id)
        if repo is None:
            return _error(404, "RepoNotFound", f"Repository Not Found for url: {request.url}.")
        if repo.token and request.headers.get("authorization") != f"Bearer {repo.token}":
            return _error(401, "RepoNotFound", "Invalid username or password.")
        commit = repo.branches.get(revision, revision)
        files = repo.commits.get(commit)
        if files is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit, files

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.get("/api/models/{repo_id:path}/revision/{revision}")
        async def model_info(repo_id: str, revision: str, request: Request) -> Response:
            self.requests[f"info {repo_id}@{revision}"] += 1
            found = self._resolve(request, repo_id, revision)
            if isinstance(found, Response):
                return found
            commit, files = found
            siblings = [{"rfilename": name, "size": len(content), "blobId": hashlib.sha1(content).hexdigest()}
                        for name, content in sorted(files.items())]
            return JSONResponse({"_id": commit, "id": repo_id, "modelId": repo_id, "sha": commit, "private": False,
                                 "disabled": False, "gated": False, "tags": [], "downloads": 0, "likes": 0,
                                 "lastModified": "2026-12-01T00:00:00.000Z", "siblings": siblings})

        @app.api_route("/{repo_id:path}/resolve/{revision}/{filename:path}", methods=["GET", "HEAD"])
        async def resolve(repo_id: str, revision: str, filename: str, request: Request) -> Response:
            self.requests[f"{request.method} {repo_id}/{filename}"] += 1
            found = self._resolve(request, repo_id, revision)
            if isinstance(found, Response):
                return found
            commit, files = found
            content = files.get(filename)
            if content is None:
                return _error(404, "EntryNotFound", f"{filename} does not exist on {revision!r}")
            headers = {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha256(content).hexdigest()}"',
                       "Content-Length": str(len(content)), "Accept-Ranges": "bytes"}
            if request.method == "HEAD":
                return Response(status_code=200, headers=headers)
            status, start = 200, 0
            if (wanted := request.headers.get("range", "")).startswith("bytes="):
                start = int(wanted.removeprefix("bytes=").split("-")[0] or 0)
                status = 206
                headers["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
                headers["Content-Length"] = str(len(content) - start)
            body = content[start:]
            if filename in self.cut:
                async def cut() -> Iterator[bytes]:
                    yield body[: len(body) // 2]
                    raise ConnectionResetError("the stand-in hub cut the download short")

                return StreamingResponse(cut(), status_code=status, headers=headers)
            return Response(body, status_code=status, headers=headers, media_type="application/octet-stream")

        return app


def _error(status: int, code: str, message: str) -> Response:
    return JSONResponse({"error": message}, status_code=status, headers={"X-Error-Code": code,
                                                                          "X-Error-Message": message})


@contextlib.contextmanager
def running() -> Iterator[tuple[HubStandIn, str]]:
    """The stand-in hub on a free loopback port; yields it and its endpoint (HF_ENDPOINT)."""
    from hotset_testing.worker_server import serve_in_thread

    hub = HubStandIn()
    with serve_in_thread(hub.app) as url:
        yield hub, url
