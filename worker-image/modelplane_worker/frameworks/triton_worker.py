"""``triton`` models: served by the pod's Triton sidecar, driven through its repository API.

Load stages the model folder into the repository shared with the sidecar
(copied under a temporary name, then renamed, so Triton never sees half a
model) and asks Triton to load it in explicit mode. Tensor names, datatypes
and shapes come from the model's own metadata, never from constants here.
Unload is explicit: Triton unloads, then the staged folder goes.

Memory: the model runs in Triton's processes, not ours. A Python-backend
model instance is its own stub process whose command line names the staged
``model.py``; when those processes are visible (same host, or a pod with
``shareProcessNamespace``), ``measured_bytes`` is their resident memory.
Otherwise (another container's pid namespace, other backends) it is the
spec's estimate, or ``DEFAULT_ESTIMATE_BYTES`` when the spec has none.
"""
from __future__ import annotations

import asyncio
import re
import shutil
import threading
import uuid
from pathlib import Path
from typing import Any, Mapping

import aiohttp
import numpy as np

from modelplane_common import errors
from modelplane_worker import engine
from modelplane_worker.frameworks import sources
from modelplane_worker.frameworks.base import ForwardedResponse, FrameworkWorker, TensorSpec

DEFAULT_ESTIMATE_BYTES = 64 * 2**20
STAGING_PREFIX = ".staging-"
CONFIG_FILE = "config.pbtxt"
# Sent with every request to the sidecar: one connection per request (see TritonWorker._call).
NEW_CONNECTION_HEADERS = {"Connection": "close"}
# Request headers an OIP v2 infer forward passes on to the sidecar, and response headers it drops.
FORWARDED_REQUEST_HEADERS = ("content-type", "inference-header-content-length", "content-encoding", "accept-encoding")
_HOP_BY_HOP_RESPONSE_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})
# The top-level `name: "..."` of a config.pbtxt (nested messages are indented).
_CONFIG_NAME = re.compile(r'^name\s*:\s*"[^"]*"\s*$', re.MULTILINE)


def _timeouts() -> tuple[type[BaseException], ...]:
    try:
        from gevent import Timeout
    except ImportError:
        return (TimeoutError,)
    return (TimeoutError, Timeout)


def _connection_errors() -> tuple[type[BaseException], ...]:
    """What tritonclient raises when the sidecar does not answer: socket errors, gevent timeouts."""
    return (OSError, *_timeouts())


def client_address(url: str) -> str:
    """tritonclient wants host:port; accept http://host:port from configuration too."""
    return url.split("://", 1)[-1].rstrip("/")


class TritonClients:
    """One tritonclient per thread: its gevent connection pool must stay on the thread that made it."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = client_address(url)
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()

    def get(self) -> Any:
        client = getattr(self._local, "client", None)
        if client is None:
            if not self.url:
                raise errors.BackendUnavailable("no Triton sidecar is configured for this worker (--triton-url)")
            import tritonclient.http as triton_http

            client = triton_http.InferenceServerClient(self.url, connection_timeout=5.0, network_timeout=self.timeout_s)
            self._local.client = client
            with self._lock:
                self._all.append(client)
        return client

    def close(self) -> None:
        with self._lock:
            clients, self._all = self._all, []
        for client in clients:
            try:
                client.close()
            except Exception:  # closing is best effort: the sidecar may be gone
                pass
        self._local = threading.local()


def _triton_exception() -> type[Exception]:
    from tritonclient.utils import InferenceServerException

    return InferenceServerException


def _message(exc: Exception) -> str:
    message = getattr(exc, "message", None)
    text = message() if callable(message) else str(exc)
    return (text or type(exc).__name__).strip()


@engine.register("triton")
class TritonWorker(FrameworkWorker):
    """A model that lives in the Triton sidecar; this object only stages, loads and forwards."""

    def __init__(self, spec: Any, context: Any) -> None:
        super().__init__(spec, context)
        self._clients = TritonClients(context.triton_url, context.triton_timeout_s)
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []
        self._loaded = False
        self._measured: int | None = None
        self._forwarder: aiohttp.ClientSession | None = None
        self._forwarder_loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def prepare(cls) -> None:
        """Import tritonclient (and gevent) at pod start."""
        import tritonclient.http  # noqa: F401

    @property
    def triton_name(self) -> str:
        """The model's name inside Triton: its modelplane id (folder and config name agree)."""
        return self.spec.id

    @property
    def staged_folder(self) -> Path:
        return Path(self.context.triton_repository) / self.triton_name

    # -- calls to the sidecar, with one translation of failures ---------------------------

    def _call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call tritonclient on a connection of its own; a sidecar that is down -> BackendUnavailable (503).

        ``Connection: close``: Triton's HTTP server answers nothing on a keep-alive
        connection opened before a model load until that load is done, so a reused
        connection made inference on loaded models wait for another model's whole
        load (3.4 s behind a 3.4 s load, found while fixing the readiness flap).
        """
        kwargs.setdefault("headers", dict(NEW_CONNECTION_HEADERS))  # a copy: tritonclient's infer adds to it
        try:
            return getattr(self._clients.get(), method)(*args, **kwargs)
        except _triton_exception():
            raise
        except _connection_errors() as exc:
            raise errors.BackendUnavailable(
                f"Triton sidecar at {self._clients.url} is unavailable ({what} {self.triton_name!r}): {exc}"
            ) from exc

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    def declared_tensors(cls, spec: Any, context: Any) -> tuple[list[TensorSpec], list[TensorSpec]] | None:
        """From the model's config.pbtxt (what Triton will report once it is loaded)."""
        return declared_in_config(sources.resolve(spec.source, context.source_roots) / CONFIG_FILE)

    def load(self) -> None:
        folder = sources.resolve(self.spec.source, self.context.source_roots)
        if not folder.is_dir():
            raise errors.ModelLoadFailed(f"model {self.spec.id!r}: triton source {folder} is not a folder")
        check_python_backend_files(folder, self.spec.id)
        self._stage(folder)
        try:
            self._call("loading", "load_model", self.triton_name)
        except _triton_exception() as exc:
            self._remove_staged()
            raise errors.ModelLoadFailed(f"Triton refused model {self.spec.id!r}: {_message(exc)}") from exc
        except errors.BackendUnavailable as exc:
            self._remove_staged()
            if isinstance(exc.__cause__, _timeouts()):
                raise errors.ModelLoadFailed(
                    f"Triton did not finish loading {self.spec.id!r} within {self._clients.timeout_s:.0f}s"
                ) from exc
            raise
        try:
            self._read_metadata()
        except Exception:
            self.unload()
            raise
        self._loaded = True
        self._measured = None

    def _stage(self, source: Path) -> None:
        """Copy `source` into the repository as <id>, atomically (temp name, then rename)."""
        repository = Path(self.context.triton_repository)
        staging = repository / f"{STAGING_PREFIX}{self.triton_name}-{uuid.uuid4().hex[:8]}"
        try:
            repository.mkdir(parents=True, exist_ok=True)
            for leftover in repository.glob(f"{STAGING_PREFIX}{self.triton_name}-*"):
                shutil.rmtree(leftover, ignore_errors=True)  # from a worker that died mid-copy
            shutil.copytree(source, staging, symlinks=False)
            self._rename_in_config(staging / CONFIG_FILE)
            if self.staged_folder.exists():
                shutil.rmtree(self.staged_folder)
            staging.rename(self.staged_folder)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise errors.ModelLoadFailed(
                f"model {self.spec.id!r}: cannot stage {source} into {repository}: {exc}"
            ) from exc

    def _rename_in_config(self, config: Path) -> None:
        """Triton requires the config's name to match its folder: serve the model under its id."""
        if not config.is_file():
            return  # Triton may auto-complete a config for some backends; it says so if it cannot
        text = config.read_text()
        renamed = _CONFIG_NAME.sub(f'name: "{self.triton_name}"', text, count=1)
        if renamed != text:
            config.write_text(renamed)

    def _read_metadata(self) -> None:
        try:
            metadata = self._call("reading metadata of", "get_model_metadata", self.triton_name)
        except _triton_exception() as exc:
            raise errors.ModelLoadFailed(f"Triton has no metadata for {self.spec.id!r}: {_message(exc)}") from exc
        self._inputs = [_tensor_spec(t) for t in metadata.get("inputs", [])]
        self._outputs = [_tensor_spec(t) for t in metadata.get("outputs", [])]

    def unload(self) -> None:
        """Unload in Triton (if it is reachable), then remove the staged folder."""
        self._loaded = False
        try:
            self._call("unloading", "unload_model", self.triton_name)
        except (_triton_exception(), errors.BackendUnavailable):
            pass  # a sidecar that is gone or never had the model holds nothing of it
        finally:
            self._remove_staged()
            self._clients.close()
            self._close_forwarder()

    def _remove_staged(self) -> None:
        shutil.rmtree(self.staged_folder, ignore_errors=True)

    def measured_bytes(self) -> int:
        if self._measured is None:
            self._measured = python_stub_rss_bytes(self.staged_folder) if self._loaded else 0
        return self._measured or self.spec.memory_bytes or DEFAULT_ESTIMATE_BYTES

    def is_ready(self) -> bool:
        if not self._loaded:
            return False
        try:
            return bool(self._call("checking", "is_model_ready", self.triton_name))
        except (_triton_exception(), errors.BackendUnavailable):
            return False

    def inputs(self) -> list[TensorSpec]:
        return list(self._inputs)

    def outputs(self) -> list[TensorSpec]:
        return list(self._outputs)

    # -- inference -------------------------------------------------------------------------

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> dict[str, np.ndarray]:
        if not self._loaded:
            raise errors.BackendUnavailable(f"model {self.spec.id!r} is not loaded")
        expected = {spec.name: spec for spec in self._inputs}
        missing = sorted(set(expected) - set(inputs))
        unknown = sorted(set(inputs) - set(expected))
        if missing or unknown:
            raise errors.BadInput(
                f"model {self.spec.id!r} takes inputs {sorted(expected)}; missing {missing}, unexpected {unknown}"
            )
        import tritonclient.http as triton_http

        request_inputs = []
        for name, spec in expected.items():
            array = _conform(inputs[name], spec)
            tensor = triton_http.InferInput(name, list(array.shape), spec.datatype)
            tensor.set_data_from_numpy(array, binary_data=True)
            request_inputs.append(tensor)
        request_outputs = [triton_http.InferRequestedOutput(spec.name, binary_data=True) for spec in self._outputs]
        try:
            try:
                result = self._call("inferring with", "infer", self.triton_name, request_inputs,
                                    outputs=request_outputs)
            except _triton_exception() as exc:
                if "unknown model" not in _message(exc) or not self.staged_folder.is_dir():
                    raise
                # The sidecar restarted and lost what it held; the staged folder survived in the
                # shared volume: load it again once rather than fail every request (found by e2e).
                self._call("reloading", "load_model", self.triton_name)
                result = self._call("inferring with", "infer", self.triton_name, request_inputs,
                                    outputs=request_outputs)
        except _triton_exception() as exc:
            status = str(exc.status() or "")
            if "unknown model" in _message(exc):
                raise errors.BackendUnavailable(
                    f"Triton no longer holds model {self.spec.id!r} (sidecar restarted?): {_message(exc)}"
                ) from exc
            if status.startswith("4"):
                raise errors.BadInput(f"Triton rejected the request for {self.spec.id!r}: {_message(exc)}") from exc
            raise errors.BackendUnavailable(f"Triton failed to serve {self.spec.id!r}: {_message(exc)}") from exc
        return {spec.name: result.as_numpy(spec.name) for spec in self._outputs}

    async def forward_infer(self, body: bytes, headers: Mapping[str, str]) -> ForwardedResponse | None:
        """Send the OIP v2 body to Triton's ``/v2/models/<id>/infer`` as it came; return Triton's answer as it came.

        Saves decoding into numpy and encoding back. Triton's own 4xx (wrong shape, datatype,
        tensor name) reaches the client with Triton's message. Each request opens a connection
        of its own (``force_close``: ``Connection: close``, see ``_call``). aiohttp rather than
        httpx: httpx alone cost ~1.6 ms a request here, aiohttp ~0.8 ms. None when Triton no
        longer knows the model (its sidecar restarted): the tensor path loads it again.
        """
        if not self._loaded:
            return None
        outgoing = {name: headers[name] for name in FORWARDED_REQUEST_HEADERS if name in headers}
        try:
            async with self._forwarding_session().post(
                f"/v2/models/{self.triton_name}/infer", data=body, headers=outgoing, allow_redirects=False
            ) as response:
                raw = await response.read()  # still encoded as Triton sent it (auto_decompress off)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError, asyncio.TimeoutError) as exc:
            raise errors.BackendUnavailable(
                f"Triton sidecar at {self._clients.url} is unavailable (inferring with {self.triton_name!r}): {exc!r}"
            ) from exc
        if response.status >= 400 and b"unknown model" in raw and self.staged_folder.is_dir():
            return None
        kept = {name: value for name, value in response.headers.items() if name.lower() not in _HOP_BY_HOP_RESPONSE_HEADERS}
        return ForwardedResponse(status=response.status, headers=kept, body=raw)

    def _forwarding_session(self) -> aiohttp.ClientSession:
        """This model's forwarding client, made on the event loop at its first forward."""
        if self._forwarder is None:
            if not self._clients.url:
                raise errors.BackendUnavailable("no Triton sidecar is configured for this worker (--triton-url)")
            self._forwarder = aiohttp.ClientSession(
                base_url=f"http://{self._clients.url}",
                connector=aiohttp.TCPConnector(force_close=True),
                timeout=aiohttp.ClientTimeout(total=self._clients.timeout_s, connect=5.0),
                auto_decompress=False,  # the body goes back with Triton's Content-Encoding
                skip_auto_headers=("Accept-Encoding", "Content-Type", "User-Agent"),  # only the client's own
            )
            self._forwarder_loop = asyncio.get_running_loop()
        return self._forwarder

    def _close_forwarder(self) -> None:
        """Close the forwarding client on its loop (unload runs on a thread); a stopped loop has nothing to close."""
        session, loop, self._forwarder, self._forwarder_loop = self._forwarder, self._forwarder_loop, None, None
        if session is None or loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(lambda: loop.create_task(session.close()))
        except RuntimeError:  # the loop closed meanwhile
            pass

    def predict(self, input_data: Any) -> Any:
        """JSON in: a nested list for a one-input model, or {input name: nested list}; out: {output: list}."""
        if isinstance(input_data, dict):
            arrays = input_data
        elif len(self._inputs) == 1:
            arrays = {self._inputs[0].name: input_data}
        else:
            names = [spec.name for spec in self._inputs]
            raise errors.BadInput(f"model {self.spec.id!r} has inputs {names}: send input_data as {{name: values}}")
        tensors = {}
        specs = {spec.name: spec for spec in self._inputs}
        for name, values in arrays.items():
            spec = specs.get(name)
            if spec is None:
                raise errors.BadInput(f"model {self.spec.id!r} has no input {name!r}; inputs: {sorted(specs)}")
            tensors[name] = _add_batch_dimension(_array_from_json(name, values, spec), spec)
        outputs = self.infer(tensors, {})
        return {name: _jsonable(array) for name, array in outputs.items()}


_BACKEND = re.compile(r'^backend\s*:\s*"([^"]*)"', re.MULTILINE)
_DEFAULT_MODEL_FILENAME = re.compile(r'^default_model_filename\s*:\s*"([^"]*)"', re.MULTILINE)


def check_python_backend_files(folder: Path, model_id: str) -> None:
    """Refuse a Python-backend model whose versions lack their model file.

    Triton 2.51 never finishes such a load: the model stays LOADING, and unload
    and shutdown hang behind it, which would take the whole sidecar down.
    """
    config = folder / CONFIG_FILE
    if not config.is_file():
        return
    text = config.read_text(errors="replace")
    backend = _BACKEND.search(text)
    if backend is None or backend.group(1) != "python":
        return
    filename_match = _DEFAULT_MODEL_FILENAME.search(text)
    filename = filename_match.group(1) if filename_match else "model.py"
    versions = [child for child in folder.iterdir() if child.is_dir() and child.name.isdigit()]
    if not versions:
        raise errors.ModelLoadFailed(f"model {model_id!r}: {folder} has no version folder (e.g. {folder}/1/{filename})")
    for version in versions:
        if not (version / filename).is_file():
            raise errors.ModelLoadFailed(f"model {model_id!r}: Python-backend model file {version / filename} is missing")


def python_stub_rss_bytes(staged_folder: Path) -> int:
    """Resident bytes of the Python-backend stubs running this model; 0 when none is visible."""
    import psutil

    prefix = f"{staged_folder}/"
    total = 0
    for process in psutil.process_iter(["cmdline", "memory_info"]):
        command = process.info.get("cmdline") or []
        memory_info = process.info.get("memory_info")
        if (len(command) > 1 and command[0].endswith("triton_python_backend_stub")
                and command[1].startswith(prefix) and memory_info is not None):
            total += memory_info.rss
    return total


def declared_in_config(config: Path) -> tuple[list[TensorSpec], list[TensorSpec]] | None:
    """Inputs and outputs from a config.pbtxt, parsed with Triton's own ModelConfig schema; None
    when there is no config (Triton would auto-complete one at load)."""
    if not config.is_file():
        return None
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    parsed = text_format.Parse(config.read_text(), model_config_pb2.ModelConfig())
    batch = [-1] if parsed.max_batch_size > 0 else []

    def spec(tensor: Any) -> TensorSpec:
        datatype = model_config_pb2.DataType.Name(tensor.data_type).removeprefix("TYPE_")
        return TensorSpec(tensor.name, "BYTES" if datatype == "STRING" else datatype, batch + [int(d) for d in tensor.dims])

    return [spec(t) for t in parsed.input], [spec(t) for t in parsed.output]


def _tensor_spec(raw: dict[str, Any]) -> TensorSpec:
    return TensorSpec(name=raw["name"], datatype=raw["datatype"], shape=[int(d) for d in raw.get("shape", [])])


def _numpy_dtype(datatype: str) -> Any:
    from tritonclient.utils import triton_to_np_dtype

    return triton_to_np_dtype(datatype)


def _conform(array: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """Check the shape against the model's metadata and cast to its datatype; BadInput names the tensor."""
    array = np.asarray(array)
    if spec.shape and (array.ndim != len(spec.shape) or any(
            want != -1 and want != got for want, got in zip(spec.shape, array.shape))):
        raise errors.BadInput(f"input {spec.name!r} must have shape {spec.shape}, got {list(array.shape)}")
    if spec.datatype == "BYTES":
        if array.dtype.kind not in "OSU":
            raise errors.BadInput(f"input {spec.name!r} must be BYTES, got {array.dtype}")
        return array.astype(np.object_)
    if array.dtype.kind in "OSUV":
        raise errors.BadInput(f"input {spec.name!r} must be {spec.datatype}, got {array.dtype}")
    if spec.datatype == "BOOL" and array.dtype != np.bool_:
        raise errors.BadInput(f"input {spec.name!r} must be BOOL, got {array.dtype}")
    target = _numpy_dtype(spec.datatype)
    if array.dtype.kind == "f" and np.dtype(target).kind in "iub":
        raise errors.BadInput(f"input {spec.name!r} must be {spec.datatype} (integers), got {array.dtype}")
    return np.ascontiguousarray(array.astype(target, copy=False))


def _array_from_json(name: str, values: Any, spec: TensorSpec) -> np.ndarray:
    try:
        if spec.datatype == "BYTES":
            return np.asarray(values, dtype=np.object_)
        return np.asarray(values, dtype=_numpy_dtype(spec.datatype))
    except (ValueError, TypeError) as exc:
        raise errors.BadInput(f"input {name!r} must be a rectangular nested list of {spec.datatype}: {exc}") from exc


def _add_batch_dimension(array: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """One example for a batched model ([-1, 4] given [4]) becomes a batch of one."""
    if spec.shape and spec.shape[0] == -1 and array.ndim == len(spec.shape) - 1:
        return array[None]
    return array


def _jsonable(array: np.ndarray) -> Any:
    if array.dtype == np.object_:
        return [item.decode("utf-8", "replace") if isinstance(item, bytes) else item for item in array.reshape(-1)]
    return array.tolist()
