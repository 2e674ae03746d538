"""The kind cluster of the e2e tier: tools, images, create, load, delete and clean up.

Two kinds of host:
- an ordinary Docker host: kind's stock node image, the official base images;
- a machine like this project's (no registry answers, CAP_SYS_RESOURCE missing,
  cgroup v1): the locally built node image (scripts/kind-node-image.sh) and a few
  kubeadm patches (``SHIM_PATCHES``). docs/e2e.md says what differs and what that
  leaves unproven.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from engine import CACHE, lacks_sys_resource
from scenarios.chart import REPO

CLUSTER = os.environ.get("HOTSET_KIND_CLUSTER", "hotset-e2e")
TAG = "e2e"
# The router runs from the control-plane image (Dockerfile.operator) with its own command.
# hotset-s3 and hotset-registry are the tier's in-cluster S3 server and OCI registry (the s3:// and
# oci:// scenarios), not part of hotset.
IMAGES = [f"hotset-operator:{TAG}", f"hotset-worker:{TAG}", f"hotset-triton-cpu:{TAG}", f"hotset-s3:{TAG}",
          f"hotset-registry:{TAG}"]
NODE_MODELS_DIR = "/models-src"

# Two nodes, both schedulable (the control plane keeps no taint): each node offers the
# host's two cores, so two nodes hold the worker pods the scenarios run at once.
CONFIG = """\
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
    extraMounts: [{{hostPath: "{models}", containerPath: {node_models}, readOnly: true}}]
  - role: worker
    extraMounts: [{{hostPath: "{models}", containerPath: {node_models}, readOnly: true}}]
kubeadmConfigPatches:
  - |
    kind: InitConfiguration
    nodeRegistration:
      taints: []
{shim}"""

# Only with the locally built node image: images named hotset.local/*, CoreDNS from
# the image's own manifest (no forward), never a pull, and kubelet on cgroup v1.
SHIM_PATCHES = """\
  - |
    kind: ClusterConfiguration
    imageRepository: hotset.local
  - |
    kind: InitConfiguration
    skipPhases: [preflight, addon/coredns]
    nodeRegistration:
      imagePullPolicy: Never
  - |
    kind: JoinConfiguration
    nodeRegistration:
      imagePullPolicy: Never
  - |
    kind: KubeletConfiguration
    failCgroupV1: false
"""


def local_images() -> bool:
    """True where images are built locally (no registry answers): HOTSET_KIND_LOCAL, else no CAP_SYS_RESOURCE."""
    forced = os.environ.get("HOTSET_KIND_LOCAL")
    return forced == "1" if forced in ("0", "1") else lacks_sys_resource()


def tool(name: str) -> str | None:
    """A tool from the project's caches (kind, kubectl v1.36.3, helm), else the venv's or PATH's."""
    candidates = [*sorted(CACHE.glob(f"tools/{name}-*/{name}")), *sorted(CACHE.glob(f"k8s-*/bin/{name}")),
                  REPO / ".venv" / "bin" / name]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(name)


def run(*argv: str, timeout: float = 1800, input: str | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, input=input,
                          env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return done.stdout


@dataclass
class KindCluster:
    """kubectl against the kind cluster's kubeconfig (the Kubectl interface of scenarios.platform)."""

    kubeconfig: Path

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([tool("kubectl") or "kubectl", "--kubeconfig", str(self.kubeconfig), *args], input=input,
                              capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def nodes(self) -> list[str]:
        """The node containers' names (kind names them after the cluster)."""
        return run(tool("kind") or "kind", "get", "nodes", "--name", CLUSTER).split()


def build_images(timings: dict[str, float]) -> str | None:
    """hotset's images, and on local-image hosts the node image; returns that node image (None: kind's own)."""
    start = time.monotonic()
    print(run(str(REPO / "scripts" / "build-images.sh"), TAG, timeout=3600), end="")
    timings["images_s"] = time.monotonic() - start
    if not local_images():
        return None
    start = time.monotonic()
    node_image = run(str(REPO / "scripts" / "kind-node-image.sh"), timeout=3600).split()[-1]
    timings["node_image_s"] = time.monotonic() - start
    return node_image


def create_cluster(workdir: Path, models_dir: Path, node_image: str | None) -> KindCluster:
    config = workdir / "kind-config.yaml"
    config.write_text(CONFIG.format(models=models_dir, node_models=NODE_MODELS_DIR,
                                    shim=SHIM_PATCHES if node_image else ""))
    kubeconfig = workdir / "kubeconfig"
    argv = [tool("kind") or "kind", "create", "cluster", "--name", CLUSTER, "--config", str(config),
            "--kubeconfig", str(kubeconfig), "--wait", "300s", "--retain"]
    if node_image:
        argv += ["--image", node_image]
    run(*argv, timeout=900)
    return KindCluster(kubeconfig)


GIB = 1 << 30
# Beyond the images themselves: the node's own files, logs and pods' emptyDirs during the scenarios.
DISK_MARGIN = 3 * GIB


def images_bytes() -> int:
    """What hotset's images take unpacked, as Docker reports them."""
    out = run("docker", "image", "inspect", "-f", "{{.Size}}", *IMAGES, timeout=60)
    return sum(int(size) for size in out.split())


def docker_root() -> Path:
    return Path(run("docker", "info", "-f", "{{.DockerRootDir}}", timeout=60).strip())


def check_disk_for_images(nodes: list[str]) -> None:
    """Refuse to start an import the disk cannot hold, naming what it needs.

    Each node's containerd lives in an anonymous volume under Docker's root. An import holds the
    image layers and their unpacked snapshots at once until it discards the layers, so the last
    node needs twice the images' size while every node before it keeps one copy: an import that
    runs out of room fails minutes later with containerd's "no space left on device" and no word
    of how much was missing."""
    root = docker_root()
    size = images_bytes()
    needed = size * (len(nodes) + 1) + DISK_MARGIN
    free = shutil.disk_usage(root).free
    if free < needed:
        raise RuntimeError(
            f"the kind tier needs {needed / GIB:.1f} GiB free under {root} to import hotset's images "
            f"({size / GIB:.1f} GiB) into {len(nodes)} nodes, and {free / GIB:.1f} GiB is free: free "
            f"{(needed - free) / GIB:.1f} GiB (docs/e2e.md, \"Disk\")")


def load_images(nodes: list[str]) -> None:
    """Import hotset's images into every node's containerd, as `kind load docker-image` does
    (docker save | ctr import), streamed (no temporary copy of the ~5.5 GB worker image) and with
    --discard-unpacked-layers, so each node keeps only the unpacked snapshots."""
    check_disk_for_images(nodes)
    def load(node: str) -> None:
        save = subprocess.Popen(["docker", "save", *IMAGES], stdout=subprocess.PIPE)
        try:
            done = subprocess.run(["docker", "exec", "-i", node, "ctr", "--namespace=k8s.io", "images", "import",
                                   "--local", "--digests", "--discard-unpacked-layers", "--snapshotter=overlayfs",
                                   "-"], stdin=save.stdout, capture_output=True, text=True, timeout=1800)
        finally:
            save.stdout.close()  # type: ignore[union-attr]
            try:
                save.wait(timeout=60)
            except subprocess.TimeoutExpired:
                save.kill()
                save.wait()
        if done.returncode != 0 or save.returncode != 0:
            raise RuntimeError(f"loading images into {node} failed: {done.stderr[-2000:]}")

    # One node at a time: an import holds the layers and their unpacked snapshot (~13 GB for
    # the worker image) until it discards the layers, and disks here are shared.
    for node in nodes:
        load(node)


def node_containers() -> list[str]:
    """Full ids of this cluster's node containers."""
    out = subprocess.run(["docker", "ps", "-aq", "--no-trunc", "--filter", f"label=io.x-k8s.kind.cluster={CLUSTER}"],
                         capture_output=True, text=True, timeout=60).stdout
    return out.split()


def delete_cluster() -> None:
    """kind delete cluster (docker rm -f -v of every node), then the cgroups Docker leaves behind."""
    ids = node_containers()
    if ids:
        subprocess.run([tool("kind") or "kind", "delete", "cluster", "--name", CLUSTER], capture_output=True,
                       timeout=300)
        leftovers = [i for i in node_containers() if i in ids]
        if leftovers:
            subprocess.run(["docker", "rm", "-f", "-v", *leftovers], capture_output=True, timeout=300)
    remove_leftover_cgroups(ids)


# kind bind-mounts the host's /lib/modules into every node; Docker creates it where it is missing.
KIND_HOST_DIRS = [Path("/lib/modules")]


def missing_host_dirs() -> list[Path]:
    return [d for d in KIND_HOST_DIRS if not d.exists()]


def remove_host_dirs(created: list[Path]) -> None:
    """Remove the (empty) host folders that the run's node containers made Docker create."""
    for folder in created:
        try:
            folder.rmdir()
        except OSError:
            pass


def remove_leftover_cgroups(container_ids: list[str]) -> list[Path]:
    """rmdir (deepest first) every cgroup of these containers still present in any hierarchy; returns what was left."""
    left: list[Path] = []
    root = Path("/sys/fs/cgroup")
    for container in container_ids:
        for hierarchy in root.iterdir() if root.is_dir() else []:
            for top in hierarchy.glob(f"**/{container}"):
                for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]:
                    try:
                        path.rmdir()
                    except OSError:
                        if path.exists():
                            left.append(path)
    return left
