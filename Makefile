# The README's two commands are `make run` and `make test`; both install first.
.PHONY: install install-k8s install-kind install-s3 install-vllm install-inference-crds images run test e2e bench clean

install:
	scripts/install.sh

install-k8s:
	scripts/install-k8s.sh

# A real S3 server (MinIO, from the Go module proxy) for the s3:// and gs:// source tests.
install-s3:
	scripts/install-s3.sh

# The Gateway API Inference Extension's InferencePool CRD (from the Go module proxy), for the
# tests of the operator's InferencePool option.
install-inference-crds:
	scripts/install-inference-crds.sh

# A real vLLM (its CPU build, in a venv of its own) for the real-engine tier.
install-vllm:
	scripts/install-vllm.sh

# The kind tier's tools: Debian's docker.io and debootstrap where missing, the node's
# Kubernetes binaries, kind, containerd, CoreDNS, kube-router... (cached per version).
install-kind: install-k8s install-s3
	scripts/install-registry.sh
	scripts/install-docker.sh
	scripts/install-k8s.sh --node
	scripts/install-kind.sh

# hotset's images (needs a running Docker engine; the kind tier starts one itself).
images: install
	scripts/build-images.sh

run: install
	.venv/bin/python scripts/local_stack.py

# Unit and integration suites, then the kind tier (also what .ci/run runs). In CI
# (CI=true) a kind tier or a real-engine tier that cannot run is an error, not a skip.
# Once every binary is built, the Go compile caches behind them (~12 GB) are dropped:
# the kind tier's images and nodes need that disk (docs/e2e.md, "Disk").
test: install install-k8s install-s3 install-inference-crds install-vllm install-kind
	scripts/drop-go-caches.sh
	HOTSET_VLLM_REQUIRED=$(if $(CI),1,0) .venv/bin/pytest -q tests
	HOTSET_KIND_REQUIRED=$(if $(CI),1,0) .venv/bin/pytest -q e2e/kind -rs --durations=20

# The kind tier alone: real images, kubelets and Services, the chart, the scenarios (docs/e2e.md).
e2e: install install-k8s install-s3 install-kind
	scripts/drop-go-caches.sh
	HOTSET_KIND_REQUIRED=$(if $(CI),1,0) .venv/bin/pytest -q e2e/kind -rs --durations=20

bench: install
	.venv/bin/python benchmarks/run_all.py

clean:
	rm -rf build .venv
