"""What a triton model folder may make the sidecar load, in cluster mode (docs/security.md).

Triton runs every model of the pod in one process, so native code that reaches
it runs beside every Triton model the pod holds, with the sidecar's files and
network. Refusing such code by file name alone (``*.so``) does not hold: ONNX
Runtime and TensorFlow ``dlopen`` whatever ``model_operations`` names, so a
library saved as ``weights.bin`` would run. This module refuses (403,
``errors.Forbidden``) what the model's own ``config.pbtxt`` asks Triton to load
and any native library anywhere in its folder, whatever its name:

- the backend must be on the worker's allowlist (``python`` runs the model's
  own ``model.py``: allowing it is allowing arbitrary code);
- the config, parsed with Triton's own ``ModelConfig`` schema, may not name
  custom-operation libraries (``model_operations``), pick the backend's library
  (``runtime``), name repository agents (libraries Triton loads by agent name;
  the sidecar installs none), set a parameter known to load a library, nor give
  a parameter (model, accelerator) a path; the fields that name files of the
  model (``default_model_filename``, ``cc_model_filenames``, ``label_filename``,
  warm-up and initial-state data files) must name them inside its folder;
- no file may be a native library: ELF, Mach-O or PE by its first four bytes,
  or named ``*.so*`` (Triton loads ``libtriton_<backend>.so`` from the model's
  folder before its own). The scan is bounded (``MAX_FILES``, ``MAX_DEPTH``) and
  a folder past the bound is refused, never half checked.

Not checked: what a model file itself computes (an ONNX graph, a TorchScript
program, a TensorRT plan run inside their runtimes), and files changed after the
check on a volume the model's owner can still write (file:// sources).
"""
from __future__ import annotations

import enum
import itertools
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Iterator

from hotset_common import errors

CONFIG_FILE = "config.pbtxt"
# Files and folder levels the scan reads before it refuses the folder: far more than a Triton model
# needs (a TensorFlow SavedModel is 3 levels deep), few enough that the check costs milliseconds.
MAX_FILES = 10_000
MAX_DEPTH = 16
# The first bytes of every native library format a Linux, macOS or Windows loader takes.
ELF = b"\x7fELF"
MACH_O = frozenset({b"\xfe\xed\xfa\xce", b"\xfe\xed\xfa\xcf", b"\xce\xfa\xed\xfe", b"\xcf\xfa\xed\xfe",
                    b"\xca\xfe\xba\xbe"})  # 32/64-bit, both byte orders, and fat (universal) binaries
PE = b"MZ"
# Parameters a backend of the default allowlist loads a library from, whatever their value: PyTorch's
# MODEL_INIT_LIBRARY dlopens a library and runs its init hook.
LIBRARY_PARAMETERS = frozenset({"MODEL_INIT_LIBRARY"})
# Triton's platform names and the backend each one runs on.
PLATFORM_BACKENDS = {
    "tensorrt_plan": "tensorrt", "tensorflow_graphdef": "tensorflow", "tensorflow_savedmodel": "tensorflow",
    "onnxruntime_onnx": "onnxruntime", "pytorch_libtorch": "pytorch", "ensemble": "ensemble",
}


class Rule(enum.Enum):
    """Why a part of a model folder is refused; the value completes the sentence naming it."""

    OP_LIBRARY = "names a custom-operation library (model_operations), which the backend would load into Triton"
    RUNTIME = "picks the library Triton loads as the backend (runtime)"
    REPOSITORY_AGENT = "names a repository agent (model_repository_agents), a library Triton would load"
    LIBRARY_PARAMETER = "sets a parameter that makes the backend load a library"
    PATH_PARAMETER = "gives a parameter a path, which could lead the backend to a file outside the model"
    FILE_OUTSIDE = "names a file outside the model's folder"
    NATIVE_CODE = "is native code (a library or an executable), whatever its name"
    LIBRARY_NAME = "is named as a shared library (*.so*), which Triton would load as backend code"
    UNREADABLE = "cannot be read to check it for native code"


@dataclass(frozen=True)
class Violation:
    """One refused part of a model folder: the file (relative to the folder), what in it, and the rule."""

    path: str
    rule: Rule
    what: str = ""

    def __str__(self) -> str:
        return f"{self.path} {self.rule.value}{f' ({self.what})' if self.what else ''}"


def check(folder: Path, model_id: str, allowed: frozenset[str]) -> None:
    """Refuse (Forbidden) `folder` unless its config asks for an allowed backend and nothing else
    that loads code, and no file in it is native code; nothing is staged or loaded before this."""
    config = parse_config(folder, model_id, allowed)
    backend = config.backend or PLATFORM_BACKENDS.get(config.platform, config.platform)
    if backend not in allowed:
        raise errors.Forbidden(f"model {model_id!r}: Triton backend {backend or 'unnamed'!r} is not allowed on this "
                               f"worker (allowed: {_listed(allowed)})")
    violations = [*config_violations(config, backend), *file_violations(folder, model_id)]
    if violations:
        raise errors.Forbidden(f"model {model_id!r} is refused by this worker's Triton trust policy: "
                               + errors.summarize([str(v) for v in violations]))


def parse_config(folder: Path, model_id: str, allowed: frozenset[str]) -> Any:
    """The folder's config.pbtxt as Triton's own ``ModelConfig`` message (tritonclient ships it)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = folder / CONFIG_FILE
    if not config.is_file():
        raise errors.Forbidden(f"model {model_id!r}: {CONFIG_FILE} is missing; this worker needs a config that names "
                               f"its backend (allowed: {_listed(allowed)})")
    try:
        return text_format.Parse(config.read_text(errors="replace"), model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise errors.ModelLoadFailed(f"model {model_id!r}: {CONFIG_FILE} is not a valid model config: {exc}") from exc


def config_violations(config: Any, backend: str) -> Iterator[Violation]:
    """What in a parsed config would make Triton or its backend load a library or leave the folder."""
    for library in config.model_operations.op_library_filename:
        yield Violation(CONFIG_FILE, Rule.OP_LIBRARY, _quoted(library))
    if config.runtime and config.runtime != f"libtriton_{backend}.so":
        yield Violation(CONFIG_FILE, Rule.RUNTIME, _quoted(config.runtime))
    for agent in config.model_repository_agents.agents:
        yield Violation(CONFIG_FILE, Rule.REPOSITORY_AGENT, _quoted(agent.name))
    parameters = [(key, value.string_value) for key, value in config.parameters.items()]
    for accelerators in (config.optimization.execution_accelerators.gpu_execution_accelerator,
                         config.optimization.execution_accelerators.cpu_execution_accelerator):
        parameters += [(key, value) for accelerator in accelerators for key, value in accelerator.parameters.items()]
    for key, value in parameters:
        if key in LIBRARY_PARAMETERS:
            yield Violation(CONFIG_FILE, Rule.LIBRARY_PARAMETER, _quoted(key))
        elif _is_path(value):
            yield Violation(CONFIG_FILE, Rule.PATH_PARAMETER, f"{_quoted(key)} = {_quoted(value)}")
    for name in _named_files(config):
        if _leaves_folder(name):
            yield Violation(CONFIG_FILE, Rule.FILE_OUTSIDE, _quoted(name))


def file_violations(folder: Path, model_id: str) -> Iterator[Violation]:
    """Every native library in `folder`, by its first bytes or its name."""
    for path in _files(folder, model_id):
        relative = str(path.relative_to(folder))
        if ".so" in path.suffixes:
            yield Violation(relative, Rule.LIBRARY_NAME)
            continue
        try:
            with open(path, "rb") as file:
                head = file.read(4)
        except OSError:
            yield Violation(relative, Rule.UNREADABLE)
            continue
        native = native_format(head)
        if native is not None:
            yield Violation(relative, Rule.NATIVE_CODE, native)


def native_format(head: bytes) -> str | None:
    """The binary format ("ELF", "Mach-O", "PE") of a file starting with `head` (its first 4 bytes);
    None for anything else."""
    if head == ELF:
        return "ELF"
    if head in MACH_O:
        return "Mach-O"
    return "PE" if head.startswith(PE) else None


def _files(folder: Path, model_id: str) -> Iterator[Path]:
    """The regular files under `folder` (links followed, as Triton follows them), at most MAX_FILES
    of them at most MAX_DEPTH levels down; Forbidden for a folder past either bound (a link loop too)."""
    count = 0
    pending: list[tuple[Path, int]] = [(folder, 0)]
    while pending:
        current, depth = pending.pop()
        for entry in _entries(current, folder, model_id):
            if entry.is_dir():
                if depth + 1 > MAX_DEPTH:
                    raise errors.Forbidden(_too_large(model_id, f"goes more than {MAX_DEPTH} folders deep"))
                pending.append((Path(entry.path), depth + 1))
            elif entry.is_file():  # a FIFO or a device is never opened: reading it could block
                count += 1
                if count > MAX_FILES:
                    raise errors.Forbidden(_too_large(model_id, f"holds more than {MAX_FILES} files"))
                yield Path(entry.path)


def _entries(current: Path, folder: Path, model_id: str) -> list[os.DirEntry[str]]:
    """`current`'s entries, at most MAX_FILES + 1 of them read; Forbidden when it cannot be listed."""
    try:
        with os.scandir(current) as entries:
            listed = list(itertools.islice(entries, MAX_FILES + 1))
    except OSError as exc:
        raise errors.Forbidden(f"model {model_id!r}: {current.relative_to(folder)}/ {Rule.UNREADABLE.value} "
                               f"({exc.strerror})") from exc
    if len(listed) > MAX_FILES:
        raise errors.Forbidden(_too_large(model_id, f"holds more than {MAX_FILES} files"))
    return listed


def _named_files(config: Any) -> Iterable[str]:
    """The names of the model's own files its config gives (each read relative to the model's folder)."""
    yield config.default_model_filename
    yield from config.cc_model_filenames.values()
    yield from (output.label_filename for output in config.output)
    yield from (initial.data_file for state in config.sequence_batching.state for initial in state.initial_state)
    yield from (tensor.input_data_file for warmup in config.model_warmup for tensor in warmup.inputs.values())


def _is_path(value: str) -> bool:
    """Absolute, or relative with a folder in it, or climbing out: where a backend would look for a file."""
    return "/" in value or ".." in value


def _leaves_folder(name: str) -> bool:
    return bool(name) and (PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts)


def _too_large(model_id: str, what: str) -> str:
    return (f"model {model_id!r}: its folder {what}; this worker checks every file of a Triton model for native "
            f"code and refuses folders past {MAX_FILES} files or {MAX_DEPTH} levels")


def _quoted(value: str) -> str:
    return errors.excerpt(value)


def _listed(allowed: frozenset[str]) -> str:
    return ", ".join(sorted(allowed)) or "none"
