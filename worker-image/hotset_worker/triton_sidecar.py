"""Start the Triton sidecar exactly as a worker pod's second container does.

``hotset-triton`` builds the ``tritonserver`` command line (explicit model
control, strict readiness off, a repository shared with the worker) and then
replaces itself with it (``os.execve``), so the container's pid is Triton's
and signals reach it directly.

Where the binary comes from, in order: ``--tritonserver`` / ``TRITONSERVER_BIN``;
the ``nvidia-pytriton`` wheel (CPU machines, Python backend only); the official
image's ``/opt/tritonserver/bin/tritonserver`` (GPU clusters, every backend).
The wheel's binary needs its bundled libraries on ``LD_LIBRARY_PATH`` and a
Python-backend stub that embeds Debian's libpython3.11, so Triton-side models
run with a venv of that Python (``scripts/install-triton.sh`` makes
``build/triton-venv``); ``PYTHONHOME`` must not point at another Python.
The embedded interpreter ignores ``PYTHONPATH``: it finds its prefix by looking
up ``python3`` on ``PATH``, so the venv's ``bin`` goes first on ``PATH`` and
the venv's ``pyvenv.cfg`` then puts its site-packages on ``sys.path``.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

OFFICIAL_IMAGE_BINARY = Path("/opt/tritonserver/bin/tritonserver")
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRITON_VENV = REPO_ROOT / "build" / "triton-venv"


class LaunchError(RuntimeError):
    """The sidecar cannot start; the message says what to install or set."""


@dataclass(frozen=True)
class Launch:
    """A resolved tritonserver invocation: what to exec and with which environment."""

    binary: Path
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def pytriton_binary() -> Path | None:
    """The tritonserver inside the nvidia-pytriton wheel, if that wheel is installed."""
    try:
        import importlib.util

        found = importlib.util.find_spec("pytriton")
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    binary = Path(list(found.submodule_search_locations)[0]) / "tritonserver" / "bin" / "tritonserver"
    return binary if binary.is_file() else None


def find_binary(explicit: str | None) -> Path:
    """The tritonserver to run; LaunchError lists where it looked."""
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise LaunchError(f"tritonserver binary {path} does not exist")
        return path
    for candidate in (pytriton_binary(), OFFICIAL_IMAGE_BINARY):
        if candidate is not None and candidate.is_file():
            return candidate
    raise LaunchError(
        "no tritonserver found: pass --tritonserver or set TRITONSERVER_BIN, install nvidia-pytriton "
        f"(pip install -e '.[worker]'), or run in the official Triton image ({OFFICIAL_IMAGE_BINARY})"
    )


def wheel_libraries(binary: Path) -> Path | None:
    """The wheel's bundled shared libraries (site-packages/nvidia_pytriton.libs), if binary is the wheel's."""
    site_packages = binary.parents[3] if len(binary.parents) > 3 else None
    libs = site_packages / "nvidia_pytriton.libs" if site_packages else None
    return libs if libs is not None and libs.is_dir() else None


def venv_site_packages(venv: Path) -> Path:
    matches = sorted(venv.glob("lib/python3*/site-packages"))
    if not matches:
        raise LaunchError(f"{venv} holds no lib/python3*/site-packages; run scripts/install-triton.sh")
    return matches[0]


def check_python_backend(backends: Path) -> None:
    """The wheel ships the stub beside the backend, not in it; install-triton.sh copies it in."""
    python_backend = backends / "python"
    if python_backend.is_dir() and not (python_backend / "triton_python_backend_stub").is_file():
        raise LaunchError(
            f"{python_backend} has no triton_python_backend_stub; run scripts/install-triton.sh"
        )


def build_launch(
    binary: Path,
    model_repository: Path,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    host: str,
    triton_venv: Path | None,
    base_env: dict[str, str],
    extra_args: list[str],
) -> Launch:
    """The command line and environment of the sidecar (pure: testable without starting it)."""
    backends = binary.parents[1] / "backends"
    argv = [
        str(binary),
        f"--model-repository={model_repository}",
        "--model-control-mode=explicit",
        # Strict readiness flips while explicit loads run; the worker decides pod readiness.
        "--strict-readiness=false",
        "--exit-on-error=false",
        f"--http-address={host}",
        f"--http-port={http_port}",
        f"--grpc-address={host}",
        f"--grpc-port={grpc_port}",
        f"--metrics-address={host}",
        f"--metrics-port={metrics_port}",
        "--allow-metrics=true",
    ]
    if backends.is_dir():
        argv.append(f"--backend-directory={backends}")
    env = dict(base_env)
    env.pop("PYTHONHOME", None)
    libs = wheel_libraries(binary)
    if libs is not None:
        check_python_backend(backends)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(libs), env.get("LD_LIBRARY_PATH", "")) if p)
        if triton_venv is None:
            raise LaunchError(
                f"the pytriton wheel's Triton needs a Debian-Python venv for its Python backend; "
                f"run scripts/install-triton.sh (makes {DEFAULT_TRITON_VENV}) or set HOTSET_TRITON_PYTHONPATH"
            )
    if triton_venv is not None:
        env["PATH"] = os.pathsep.join(p for p in (str(triton_venv / "bin"), env.get("PATH", "")) if p)
        env["PYTHONPATH"] = str(venv_site_packages(triton_venv))
    return Launch(binary=binary, argv=argv + extra_args, env=env)


def resolve_triton_venv(option: str | None) -> Path | None:
    """The venv for Python-backend models, given as the venv or its site-packages folder.

    Defaults to build/triton-venv when it exists; None where the image brings its own Python.
    """
    if not option:
        return DEFAULT_TRITON_VENV if (DEFAULT_TRITON_VENV / "pyvenv.cfg").is_file() else None
    path = Path(option).resolve()
    for candidate in (path, *path.parents[:3]):
        if (candidate / "pyvenv.cfg").is_file():
            return candidate
    raise LaunchError(f"triton python path {path} is neither a venv nor a venv's site-packages (no pyvenv.cfg)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="hotset-triton", description="Start tritonserver as hotset's worker sidecar."
    )
    parser.add_argument("--model-repository", type=Path, default=os.environ.get("HOTSET_TRITON_REPOSITORY", "/models"))
    parser.add_argument("--http-port", type=int, default=int(os.environ.get("HOTSET_TRITON_HTTP_PORT", "8000")))
    parser.add_argument("--grpc-port", type=int, default=int(os.environ.get("HOTSET_TRITON_GRPC_PORT", "8001")))
    parser.add_argument("--metrics-port", type=int, default=int(os.environ.get("HOTSET_TRITON_METRICS_PORT", "8002")))
    parser.add_argument("--host", default=os.environ.get("HOTSET_TRITON_HOST", "127.0.0.1"),
                        help="address Triton listens on (the worker reaches it over the pod's localhost)")
    parser.add_argument("--tritonserver", default=os.environ.get("TRITONSERVER_BIN"),
                        help="the tritonserver binary (default: the pytriton wheel's, else the official image's)")
    parser.add_argument("--triton-pythonpath", default=os.environ.get("HOTSET_TRITON_PYTHONPATH"),
                        help="venv (or its site-packages) for Python-backend models (default: build/triton-venv)")
    parser.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: passed to tritonserver as they are")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    try:
        repository = args.model_repository.resolve()
        repository.mkdir(parents=True, exist_ok=True)
        launch = build_launch(
            binary=find_binary(args.tritonserver),
            model_repository=repository,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            metrics_port=args.metrics_port,
            host=args.host,
            triton_venv=resolve_triton_venv(args.triton_pythonpath),
            base_env=dict(os.environ),
            extra_args=extra,
        )
    except LaunchError as exc:
        sys.exit(f"hotset-triton: {exc}")
    if args.dry_run:
        print(" ".join(launch.argv))
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(launch.binary, launch.argv, launch.env)


if __name__ == "__main__":
    main()
