# The README's two commands are `make run` and `make test`; both install first.
.PHONY: install install-k8s run test e2e e2e-kind bench clean

install:
	scripts/install.sh

install-k8s:
	scripts/install-k8s.sh

run: install
	.venv/bin/python scripts/local_stack.py

# Unit and integration suites, then the local e2e tier (also what .ci/run runs).
test: install install-k8s
	.venv/bin/pytest -q tests
	.venv/bin/pytest -q e2e/local -rs

# The local e2e tier: real control plane + node agent, the chart, the scenarios (docs/e2e.md).
e2e: install install-k8s
	.venv/bin/pytest -q e2e/local -rs

# The kind e2e tier for Docker hosts; skips with a clear message elsewhere (e2e/kind/README.md).
e2e-kind: install install-k8s
	.venv/bin/pytest -q e2e/kind -rs

bench: install
	.venv/bin/python benchmarks/run_all.py

clean:
	rm -rf build .venv
