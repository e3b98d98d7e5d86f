# The two commands of the README: `make demo` (the product's main job on the
# local control plane) and `make test` (every test, the cluster ones included).
# Both install what is missing first, so they work on a fresh machine.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: crd chart-docs docs helm-docs demo demo-down demo-status lint test test-fast test-node setup system-packages control-plane node-binaries image bench bench-peers clean

# On a host that can run a real node (root, network namespaces, cgroups,
# overlayfs), the demo runs there: real pods (hack/node/demo.py). Elsewhere,
# or with DEMO=podrunner, it says why and runs on the pod runner.
DEMO ?= auto
demo: setup control-plane
	@if [ "$(DEMO)" != podrunner ] && $(PY) hack/node/demo.py check; then \
	    $(MAKE) --no-print-directory node-binaries image && $(PY) hack/node/demo.py up; \
	else $(PY) -m stalledpolicy.devenv.demo up; fi

demo-down:
	@if [ -f .demo-node/state.json ]; then $(PY) hack/node/demo.py down; fi
	$(PY) -m stalledpolicy.devenv.demo down

demo-status:
	@if [ -f .demo-node/state.json ]; then $(PY) hack/node/demo.py status; \
	else $(PY) -m stalledpolicy.devenv.demo status; fi

# Two sessions: every test but the real node's (pyproject's addopts deselect
# `node`), then the real node's, inside a network namespace of their own
# (hack/node/run_tests.py; root, netns, cgroups and overlayfs, else it fails).
test: setup control-plane helm-docs node-binaries image
	$(PY) -m pytest
	$(PY) hack/node/run_tests.py

# The real node's session alone (tests/node; docs/development.md).
test-node: setup control-plane node-binaries image
	$(PY) hack/node/run_tests.py

test-fast: setup helm-docs
	$(PY) -m pytest -m "not kube and not slow and not node"

# The code checks (tests/unit/test_code_quality.py runs them too, so `make test`
# and CI enforce them): ruff, mypy ([tool.mypy]) and the import layers (.importlinter).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	PYTHONPATH=operator $(VENV)/bin/lint-imports

setup: system-packages $(STAMP)

system-packages:
	@PYTHON=$(PYTHON) bash hack/install-system-packages.sh

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

control-plane: setup
	@bash hack/control-plane/build.sh

# kubelet and kube-scheduler for the real node (hack/node/build.sh; nothing
# when up to date), beside the control plane's binaries.
node-binaries: control-plane
	@bash hack/node/build.sh >/dev/null

# helm-docs, from its pinned Go module into ~/.cache/stalledpolicy/helm-docs/
# (seconds; nothing when up to date): tests/unit/test_chart_docs.py needs it.
helm-docs:
	@bash hack/helm-docs/build.sh >/dev/null

# The product's image as a docker-archive, without a container engine or a
# registry (docs/image.md): build/image/stalledpolicy-operator-<version>.tar.
# Needs root. IMAGE_FLAGS=--force rebuilds when nothing changed.
IMAGE_FLAGS ?=
image: system-packages
	$(PYTHON) hack/image/build.py $(IMAGE_FLAGS)

bench: setup
	$(PY) bench/sweep.py

bench-peers: setup
	$(PY) bench/peers/run.py

clean:
	rm -rf $(VENV) build dist operator/*.egg-info

# The CRD, generated from the models (operator/stalledpolicy/policy/: models.py,
# resource.py, crd.py) into crds/stalledpolicies.yaml and the chart's copy (Helm
# cannot read outside the chart); tests/unit/test_generated_docs.py fails until
# both are refreshed.
crd: setup
	$(PY) hack/gen-crd.py

# The chart's README.md, from README.md.gotmpl and the "# --" comments of
# values.yaml; tests/unit/test_chart_docs.py fails until it is refreshed.
chart-docs: helm-docs
	bash hack/helm-docs/run.sh

# Every generated file: the CRD (make crd), the chart's README and the generated
# parts of docs/reference.md (the CRD), docs/metrics.md (the registries) and
# docs/cli.md (the parsers); tests/unit/test_generated_docs.py fails until they
# are refreshed.
docs: setup crd chart-docs
	$(PY) hack/gen-crd-reference.py
	$(PY) hack/gen-metrics-reference.py
	$(PY) hack/gen-cli-reference.py
