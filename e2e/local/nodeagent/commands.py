"""From a container spec to the argv of a local process.

There are no images here, so an image name is mapped to a local entry point:

- a ``command`` whose first word is ``tritonserver`` (any path) runs the Triton
  launcher ``modelplane-triton`` with the same arguments;
- a ``command`` whose first word is ``python``/``python3`` runs the venv's Python;
- a ``command`` whose first word names a program in the venv's ``bin`` runs it;
- no ``command``: the image's entry point, chosen by a word in the image name
  (``triton`` -> modelplane-triton, ``worker`` -> modelplane-worker,
  ``router`` -> modelplane-router, ``operator`` -> modelplane-operator).

A pod's containers share one network namespace in Kubernetes; here each pod has
its own loopback address, so text that means "this pod" is rewritten in args
and env values: ``0.0.0.0``, ``127.0.0.1`` and ``localhost`` become the pod IP,
and a volume's mountPath (e.g. ``/models``) becomes the host folder behind it.
A launcher that takes a bind address (``--host``) and was not given one gets
``--host <pod IP>``.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable

IMAGE_ENTRY_POINTS = (
    ("triton", "modelplane-triton"),
    ("worker", "modelplane-worker"),
    ("router", "modelplane-router"),
    ("operator", "modelplane-operator"),
)
# Entry points that bind an HTTP server and take its address as --host.
HOST_FLAG_PROGRAMS = {"modelplane-triton", "modelplane-worker", "modelplane-router"}
PYTHONS = {"python", "python3", "python3.11"}
LOOPBACK = re.compile(r"(?<![\w.])(0\.0\.0\.0|127\.0\.0\.1|localhost)(?![\w.])")


class UnmappedImage(Exception):
    """The container names an image this agent has no local entry point for."""


def image_entry_point(image: str) -> str:
    repository = image.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]
    for word, program in IMAGE_ENTRY_POINTS:
        if word in repository:
            return program
    raise UnmappedImage(f"no local entry point for image {image!r}; known words: {[w for w, _ in IMAGE_ENTRY_POINTS]}")


def resolve_argv(container: dict[str, Any], venv_bin: Path) -> list[str]:
    """The argv the container would run, with its program found locally."""
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    if not command and args and Path(args[0]).name == "tritonserver":
        command, args = args[:1], args[1:]  # the official image's entrypoint script takes the command as args
    if not command:
        return [str(venv_bin / image_entry_point(container.get("image", ""))), *args]
    program = Path(command[0]).name
    if program == "tritonserver":
        return [str(venv_bin / "modelplane-triton"), *launcher_args([*command[1:], *args])]
    if program in PYTHONS:
        return [str(venv_bin / "python"), *command[1:], *args]
    if (venv_bin / program).exists():
        return [str(venv_bin / program), *command[1:], *args]
    return [*command, *args]


# tritonserver flags the launcher takes under its own name, and those it always sets itself.
LAUNCHER_FLAGS = {"--model-repository": "--model-repository", "--http-port": "--http-port",
                  "--grpc-port": "--grpc-port", "--metrics-port": "--metrics-port", "--http-address": "--host"}
LAUNCHER_SETS = {"--model-control-mode", "--strict-readiness", "--exit-on-error", "--grpc-address",
                 "--metrics-address", "--allow-metrics", "--backend-directory"}


def launcher_args(triton_args: list[str]) -> list[str]:
    """tritonserver's command line as modelplane-triton's: known flags renamed, the rest after ``--``."""
    mine: list[str] = []
    passthrough: list[str] = []
    i = 0
    while i < len(triton_args):
        flag, has_value, value = triton_args[i].partition("=")
        if not has_value and flag.startswith("--") and i + 1 < len(triton_args) and not triton_args[i + 1].startswith("--"):
            value, i = triton_args[i + 1], i + 1
        i += 1
        if flag in LAUNCHER_FLAGS:
            mine += [LAUNCHER_FLAGS[flag], value]
        elif flag not in LAUNCHER_SETS:
            passthrough.append(f"{flag}={value}" if value else flag)
    return mine + (["--", *passthrough] if passthrough else [])


def container_argv(container: dict[str, Any], env: dict[str, str], rewrite: Callable[[str], str],
                   venv_bin: Path) -> list[str]:
    """The local argv of a container: the spec's words expanded and rewritten, then resolved.

    Only the pod spec's words are rewritten: the local program path must not
    be, or a checkout under a mounted path (a repo in /tmp, with a /tmp
    emptyDir) would point the program into the pod's volume.
    """
    words = {key: [rewrite(expand_vars(a, env)) for a in container.get(key) or []] for key in ("command", "args")}
    return resolve_argv({**container, **words}, venv_bin)


def with_bind_host(argv: list[str], pod_ip: str) -> list[str]:
    """Add --host <pod IP> for our HTTP entry points when the spec gave none."""
    if Path(argv[0]).name not in HOST_FLAG_PROGRAMS:
        return argv
    if any(a == "--host" or a.startswith("--host=") for a in argv[1:]):
        return argv
    if "--" in argv:  # options go before the launcher's passthrough separator
        cut = argv.index("--")
        return [*argv[:cut], "--host", pod_ip, *argv[cut:]]
    return [*argv, "--host", pod_ip]


def expand_vars(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names expand, $$(VAR) escapes."""
    def replace(match: re.Match[str]) -> str:
        if match.group(0).startswith("$$"):
            return match.group(0)[1:]
        name = match.group(1)
        return env.get(name, match.group(0))

    return re.sub(r"\$\$?\(([A-Za-z_][A-Za-z0-9_]*)\)", replace, text)


class PodRewriter:
    """Rewrites text that means "this pod" to what it is on this machine (one pass, longest mount first)."""

    def __init__(self, pod_ip: str, mounts: dict[str, Path]) -> None:
        self.pod_ip = pod_ip
        self._mounts = {path.rstrip("/") or "/": host for path, host in mounts.items()}
        alternatives = "|".join(re.escape(p) for p in sorted(self._mounts, key=len, reverse=True))
        self._pattern = re.compile(r"(?<![\w./-])(" + alternatives + r")(?=/|$|[\s:,;\"'])") if self._mounts else None

    def __call__(self, text: str) -> str:
        text = LOOPBACK.sub(self.pod_ip, text)
        if self._pattern is not None:
            text = self._pattern.sub(lambda m: str(self._mounts[m.group(1)]), text)
        return text


def container_mounts(container: dict[str, Any], volume_dirs: dict[str, Path]) -> dict[str, Path]:
    """mountPath -> host folder for one container (subPath honoured)."""
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        host = volume_dirs.get(mount["name"])
        if host is None:
            continue
        if mount.get("subPath"):
            host = host / mount["subPath"]
            host.mkdir(parents=True, exist_ok=True) if not host.suffix else None
        mounts[mount["mountPath"]] = host
    return mounts


def executable_exists(argv: list[str]) -> bool:
    program = argv[0]
    if os.sep in program:
        return os.access(program, os.X_OK)
    return any(os.access(os.path.join(d, program), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep))
