"""``triton`` models: served by the pod's Triton sidecar, driven through its repository API.

Load stages the model folder into the repository shared with the sidecar
(built under a temporary name, then renamed, so Triton never sees half a
model) and asks Triton to load it in explicit mode. A folder Triton can read
where it is (the source cache, an image volume: ``WorkerContext.shared_roots``,
mounted at the same path in both containers) is linked, not copied: the
staged folder holds its renamed config.pbtxt and a symlink per other entry,
so a load costs no copy of the weights and no second copy on disk. Anything
else (a pvc:// claim only the worker mounts) is copied as before. Tensor names, datatypes
and shapes come from the model's own metadata, never from constants here.
Unload is explicit: Triton unloads, then the staged folder goes. Every call
to the sidecar goes through the pod's one ``TritonBackend`` (the worker
context's ``backends["triton"]``).

Memory: the model runs in Triton's processes, not ours. ``measured_bytes`` is,
in order: what Triton's model statistics report (``memory_usage``: backends
that track their allocations, e.g. on a GPU); the resident memory of the
model's Python-backend stub processes when they are visible (same host, or a
pod with ``shareProcessNamespace``; their command line names the staged
``model.py``); the spec's estimate; ``DEFAULT_ESTIMATE_BYTES``.
"""
from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from hotset_common import errors
from hotset_worker import engine
from hotset_worker.frameworks import sources, triton_policy
from hotset_worker.frameworks.base import ForwardedResponse, FrameworkWorker, TensorSpec
from hotset_worker.triton_backend import NAME as BACKEND_NAME, TritonBackend, TritonRefused

DEFAULT_ESTIMATE_BYTES = 64 * 2**20
STAGING_PREFIX = ".staging-"
CONFIG_FILE = "config.pbtxt"
# The top-level `name: "..."` of a config.pbtxt (nested messages are indented).
_CONFIG_NAME = re.compile(r'^name\s*:\s*"[^"]*"\s*$', re.MULTILINE)
# Triton's answer for a model it does not hold (e.g. after its container restarted).
UNKNOWN_MODEL = "unknown model"


@engine.register("triton")
class TritonWorker(FrameworkWorker):
    """A model that lives in the Triton sidecar; this object only stages, loads and forwards."""

    def __init__(self, spec: Any, context: Any) -> None:
        super().__init__(spec, context)
        self._backend: TritonBackend | None = context.backends.get(BACKEND_NAME)
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []
        self._loaded = False
        self._measured: int | None = None
        self._reported_by_triton = False
        self._checked: Path | None = None
        # A hard budget evicts between creating a worker and loading it (manager._prepare): a folder
        # the trust policy refuses must be refused here, before any copy makes room for it. A remote
        # source not fetched yet (a load-first budget, which evicts only after load) is checked at load.
        if context.triton_backends is not None:
            folder = sources.cached_folder(spec, context)
            if folder is not None and folder.is_dir():
                self._check_policy(folder)

    def _check_policy(self, folder: Path) -> None:
        """The pod's trust policy (cluster mode: triton_policy), once per folder."""
        if self.context.triton_backends is not None and folder != self._checked:
            triton_policy.check(folder, self.spec.id, self.context.triton_backends)
        self._checked = folder

    @classmethod
    def prepare(cls) -> None:
        """Import tritonclient's codec at pod start."""
        import tritonclient.http  # noqa: F401

    @property
    def backend(self) -> TritonBackend:
        if self._backend is None or not self._backend.configured:
            raise errors.BackendUnavailable("no Triton sidecar is configured for this worker (--triton-url)")
        return self._backend

    @property
    def triton_name(self) -> str:
        """The model's name inside Triton: its hotset id (folder and config name agree)."""
        return self.spec.id

    @property
    def staged_folder(self) -> Path:
        return self.backend.repository / self.triton_name

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    def declared_tensors(cls, spec: Any, context: Any) -> tuple[list[TensorSpec], list[TensorSpec]] | None:
        """From the model's config.pbtxt (what Triton will report once it is loaded)."""
        folder = sources.cached_folder(spec, context)
        return None if folder is None else declared_in_config(folder / CONFIG_FILE)

    def load(self) -> None:
        backend = self.backend
        folder = sources.folder(self.spec, self.context)
        if not folder.is_dir():
            raise errors.ModelLoadFailed(f"model {self.spec.id!r}: triton source {folder} is not a folder")
        self._check_policy(folder)
        check_python_backend_files(folder, self.spec.id)
        self._stage(folder)
        try:
            backend.load(self.triton_name)
        except TritonRefused as exc:
            self._remove_staged()
            raise errors.ModelLoadFailed(f"Triton refused model {self.spec.id!r}: {exc.message}") from exc
        except errors.BackendUnavailable as exc:
            self._remove_staged()
            if isinstance(exc.__cause__, TimeoutError):
                raise errors.ModelLoadFailed(
                    f"Triton did not finish loading {self.spec.id!r} within {backend.timeout_s:.0f}s"
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
        """Put `source` into the repository as <id>, atomically (temp name, then rename): linked
        when Triton shares the folder it lives in, else copied."""
        repository = self.backend.repository
        staging = repository / f"{STAGING_PREFIX}{self.triton_name}-{uuid.uuid4().hex[:8]}"
        try:
            repository.mkdir(parents=True, exist_ok=True)
            for leftover in repository.glob(f"{STAGING_PREFIX}{self.triton_name}-*"):
                shutil.rmtree(leftover, ignore_errors=True)  # from a worker that died mid-copy
            if self._shared_with_triton(source):
                _link_tree(source, staging)
            else:
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

    def _shared_with_triton(self, source: Path) -> bool:
        real = source.resolve()
        return any(real == root or root in real.parents for root in (Path(r).resolve() for r in self.context.shared_roots))

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
            metadata = self.backend.metadata(self.triton_name)
        except TritonRefused as exc:
            raise errors.ModelLoadFailed(f"Triton has no metadata for {self.spec.id!r}: {exc.message}") from exc
        self._inputs = [_tensor_spec(t) for t in metadata.get("inputs", [])]
        self._outputs = [_tensor_spec(t) for t in metadata.get("outputs", [])]

    def unload(self) -> None:
        """Unload in Triton (if it is reachable), then remove the staged folder."""
        self._loaded = False
        if self._backend is None or not self._backend.configured:
            return
        try:
            self._backend.unload(self.triton_name)
        except (TritonRefused, errors.BackendUnavailable):
            pass  # a sidecar that is gone or never had the model holds nothing of it
        finally:
            self._remove_staged()

    def _remove_staged(self) -> None:
        shutil.rmtree(self.staged_folder, ignore_errors=True)

    def measured_bytes(self) -> int:
        if self._measured is None:
            self._measured = 0
            if self._loaded:
                reported = self.backend.memory_bytes(self.triton_name)
                self._reported_by_triton = reported > 0
                self._measured = reported or python_stub_rss_bytes(self.staged_folder)
        return self._measured or self.spec.memory_bytes or DEFAULT_ESTIMATE_BYTES

    def measures_its_own_bytes(self) -> bool:
        # Triton's own accounting of the model's allocations is exact; a Python stub's resident
        # memory holds its interpreter too and differs between Triton builds.
        return self._reported_by_triton

    def is_ready(self) -> bool:
        return self._loaded and self.backend.model_ready(self.triton_name)

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
                result = self.backend.infer(self.triton_name, request_inputs, request_outputs)
            except TritonRefused as exc:
                if UNKNOWN_MODEL not in exc.message or not self.staged_folder.is_dir():
                    raise
                # The sidecar restarted and lost what it held; the staged folder survived in the
                # shared volume: load it again once rather than fail every request (found by e2e).
                self.backend.load(self.triton_name)
                result = self.backend.infer(self.triton_name, request_inputs, request_outputs)
        except TritonRefused as exc:
            if UNKNOWN_MODEL in exc.message:
                raise errors.BackendUnavailable(
                    f"Triton no longer holds model {self.spec.id!r} (sidecar restarted?): {exc.message}"
                ) from exc
            if 400 <= exc.status < 500:
                raise errors.BadInput(f"Triton rejected the request for {self.spec.id!r}: {exc.message}") from exc
            raise errors.BackendUnavailable(f"Triton failed to serve {self.spec.id!r}: {exc.message}") from exc
        return {spec.name: result.as_numpy(spec.name) for spec in self._outputs}

    async def forward_infer(self, body: bytes, headers: Mapping[str, str]) -> ForwardedResponse | None:
        """Send the OIP v2 body to Triton's ``/v2/models/<id>/infer`` as it came; return Triton's answer as it came.

        Saves decoding into numpy and encoding back. Triton's own 4xx (wrong shape, datatype,
        tensor name) reaches the client with Triton's message. None when Triton no longer
        knows the model (its sidecar restarted): the tensor path loads it again.
        """
        if not self._loaded:
            return None
        answer = await self.backend.forward_infer(self.triton_name, body, headers)
        if answer.status >= 400 and UNKNOWN_MODEL.encode() in answer.body and self.staged_folder.is_dir():
            return None
        return answer

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


def _link_tree(source: Path, staging: Path) -> None:
    """`staging` holding a copy of `source`'s config (it is renamed) and a symlink to everything else."""
    staging.mkdir()
    for child in source.iterdir():
        if child.name == CONFIG_FILE:
            shutil.copyfile(child, staging / CONFIG_FILE)
        else:
            (staging / child.name).symlink_to(child.resolve())


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
