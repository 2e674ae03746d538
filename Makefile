# The README's two commands are `make run` and `make test`; both install first.
.PHONY: install install-k8s run test e2e bench clean

install:
	scripts/install.sh

install-k8s:
	scripts/install-k8s.sh

run: install
	.venv/bin/python scripts/local_stack.py

test: install install-k8s
	.venv/bin/pytest -q tests

e2e: install install-k8s
	.venv/bin/pytest -q e2e/local

bench: install
	.venv/bin/python benchmarks/run_all.py

clean:
	rm -rf build .venv
