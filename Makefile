# The two commands of the README: `make demo` (the product's main job on the
# local control plane) and `make test` (every test, the cluster ones included).
# Both install what is missing first, so they work on a fresh machine.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: chart-crd demo demo-down demo-status test test-fast setup system-packages control-plane image bench bench-peers clean

demo: setup control-plane
	$(PY) -m stalledpolicy.devenv.demo up

demo-down:
	$(PY) -m stalledpolicy.devenv.demo down

demo-status:
	$(PY) -m stalledpolicy.devenv.demo status

test: setup control-plane
	$(PY) -m pytest

test-fast: setup
	$(PY) -m pytest -m "not kube and not slow"

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

# The chart renders a copy of the one CRD source (Helm cannot read outside the
# chart); tests/unit/test_chart_files.py fails until the copy is refreshed.
chart-crd:
	cp crds/stalledpolicies.yaml charts/stalledpolicy-operator/files/crds/stalledpolicies.yaml
