"""``hf://org/name[@revision]``: a repository in the Hugging Face hub's layout, through huggingface_hub.

The hub's own client does the talking (``HfApi.model_info`` to resolve the
revision and list the files, ``hf_hub_download`` per file), against the pool's
mirror (``HF_ENDPOINT``) or the public hub, with the token of the Secret the
source names (``HF_TOKEN``) and never one found on the machine. The revision
(a branch, a tag or a commit) is resolved to its commit first: the commit is
the cache key, so a branch that moved is a new entry and an unchanged one a
hit; every file is then fetched at that commit, never at the moving name.

Worker images run with ``HF_HUB_OFFLINE=1`` so that nothing else in the
process reaches a hub; a fetch lifts it for its own calls only (``_online``),
and transformers itself only ever reads the local folder.
"""
from __future__ import annotations

import contextlib
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from hotset_common import errors
from hotset_common.sources import HF_HUB_ENDPOINT, HubRepo
from hotset_common.spec import SourceOptions
from hotset_worker.sources import credentials as credentials_module
from hotset_worker.sources.cache import Progress
from hotset_worker.sources.plan import FetchPlan, SourceSettings, content_key

_OFFLINE_GUARD = threading.Lock()
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
CLIENT_CACHE = ".cache"  # what hf_hub_download keeps beside the files in a local_dir: removed


def _endpoint(settings: SourceSettings) -> str:
    return settings.hf_endpoint or HF_HUB_ENDPOINT


def known_key(location: HubRepo, settings: SourceSettings) -> str | None:
    """The cache key without asking the hub, when the revision is a commit (40 hex digits):
    a cached commit loads with no request. A branch or tag must be resolved first."""
    if _COMMIT.match(location.revision):
        return content_key("hf", _endpoint(settings), location.repo_id, location.revision)
    return None


def plan(uri: str, location: HubRepo, options: SourceOptions, settings: SourceSettings,
         credentials: credentials_module.Credentials) -> FetchPlan:
    endpoint = _endpoint(settings)
    secret = credentials.lookup(options.namespace, options.secret_name, credentials_module.HF_KEYS, uri)
    token: str | bool = secret.get("HF_TOKEN") or False  # False: never a token file of the machine
    info = _model_info(uri, location, endpoint, token)
    commit = str(info.sha)
    files = [(sibling.rfilename, int(sibling.size or 0)) for sibling in info.siblings or []]
    if not files:
        raise errors.ModelLoadFailed(f"source {uri!r}: repository {location.repo_id!r} at revision "
                                     f"{location.revision!r} ({commit[:12]}) holds no files on {endpoint}")
    for name, _ in files:
        _refuse_outside(uri, name)

    def fill(folder: Path, progress: Progress, deadline: float) -> None:
        progress.probe = lambda: _incomplete_bytes(folder)
        for name, size in files:
            if time.monotonic() > deadline:
                raise errors.ModelLoadFailed(f"source {uri!r}: the load's deadline passed before {name!r} was "
                                             "downloaded; nothing was kept")
            _download(uri, location, endpoint, token, commit, name, size, folder)
            progress.add(size)
        progress.probe = None
        shutil.rmtree(folder / CLIENT_CACHE, ignore_errors=True)

    return FetchPlan(key=content_key("hf", endpoint, location.repo_id, commit), total_bytes=sum(s for _, s in files),
                     fill=fill, scheme="hf", describe=f"{len(files)} files of {location.repo_id}@{commit[:12]} from {endpoint}")


@contextlib.contextmanager
def _online() -> Iterator[None]:
    """huggingface_hub with its offline switch off, for this fetch's calls."""
    from huggingface_hub import constants

    with _OFFLINE_GUARD:
        before = constants.HF_HUB_OFFLINE
        constants.HF_HUB_OFFLINE = False
        try:
            yield
        finally:
            constants.HF_HUB_OFFLINE = before


def _model_info(uri: str, location: HubRepo, endpoint: str, token: str | bool) -> Any:
    from huggingface_hub import HfApi

    try:
        with _online():
            return HfApi(endpoint=endpoint, token=token).model_info(location.repo_id, revision=location.revision,
                                                                     files_metadata=True, timeout=30)
    except Exception as exc:  # noqa: BLE001 - every client failure becomes a load failure naming it
        raise _explain(exc, uri, location, endpoint, file="") from exc


def _download(uri: str, location: HubRepo, endpoint: str, token: str | bool, commit: str, name: str,
              size: int, folder: Path) -> None:
    from huggingface_hub import hf_hub_download

    try:
        with _online():
            path = Path(hf_hub_download(location.repo_id, name, revision=commit, local_dir=folder,
                                        endpoint=endpoint, token=token, etag_timeout=30))
    except Exception as exc:  # noqa: BLE001
        raise _explain(exc, uri, location, endpoint, file=name) from exc
    if size and path.stat().st_size != size:
        raise errors.ModelLoadFailed(f"source {uri!r}: file {name!r} was truncated: {path.stat().st_size} of {size} "
                                     "bytes; nothing was kept")


def _refuse_outside(uri: str, name: str) -> None:
    parts = name.split("/")
    if name.startswith("/") or ".." in parts or name.startswith(CLIENT_CACHE + "/"):
        raise errors.ModelLoadFailed(f"source {uri!r}: repository file {name[:120]!r} is not a path inside the "
                                     "model's folder")


def _incomplete_bytes(folder: Path) -> int:
    """Bytes of the file being downloaded now (huggingface_hub writes it as ``*.incomplete``)."""
    total = 0
    with contextlib.suppress(OSError):
        for partial in (folder / CLIENT_CACHE).rglob("*.incomplete"):
            total += partial.stat().st_size
    return total


def _explain(exc: Exception, uri: str, location: HubRepo, endpoint: str, file: str) -> errors.ModelLoadFailed:
    from huggingface_hub import errors as hub_errors

    where = f"source {uri!r} (repository {location.repo_id!r} at {endpoint})"
    if isinstance(exc, hub_errors.RevisionNotFoundError):
        return errors.ModelLoadFailed(f"{where}: revision {location.revision!r} does not exist")
    if isinstance(exc, hub_errors.LocalEntryNotFoundError):  # the client's fallback when the hub did not answer
        cause = exc.__cause__ or exc.__context__ or exc
        return errors.ModelLoadFailed(f"{where}: fetching {file!r} failed: the hub did not answer "
                                      f"({type(cause).__name__}: {str(cause).splitlines()[0][:200] if str(cause) else ''})")
    if isinstance(exc, hub_errors.EntryNotFoundError):
        return errors.ModelLoadFailed(f"{where}: file {file!r} does not exist at that revision")
    if isinstance(exc, hub_errors.GatedRepoError):
        return errors.ModelLoadFailed(f"{where}: the repository is gated; its token (HF_TOKEN in the Secret that "
                                      "source.secretName names) has no access")
    if isinstance(exc, hub_errors.RepositoryNotFoundError):
        return errors.ModelLoadFailed(f"{where}: the repository does not exist, or the token (HF_TOKEN in the "
                                      "Secret that source.secretName names) may not read it")
    if isinstance(exc, hub_errors.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", "")
        if status in (401, 403):
            return errors.ModelLoadFailed(f"{where}: access refused ({status}); check HF_TOKEN in the Secret that "
                                          "source.secretName names")
        return errors.ModelLoadFailed(f"{where}: the hub answered {status} for {file or 'the repository'}: "
                                      f"{str(exc).splitlines()[0][:200]}")
    what = f"{file!r}" if file else "the repository's files"
    return errors.ModelLoadFailed(f"{where}: fetching {what} failed ({type(exc).__name__}: {str(exc)[:200]})")
