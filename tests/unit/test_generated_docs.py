"""Generated files are current: each generator's output equals the committed file
(the CRD and its chart copy, from the models; the generated parts of the docs).

A failure names the command that brings the file up to date.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load(script: str):
    path = REPO / "hack" / script
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script, path, source, command", [
    ("gen-crd.py", "crds/stalledpolicies.yaml", "the models", "make crd"),
    ("gen-crd.py", "charts/stalledpolicy-operator/files/crds/stalledpolicies.yaml", "the models", "make crd"),
    ("gen-crd-reference.py", "docs/reference.md", "crds/stalledpolicies.yaml", "make docs"),
    ("gen-metrics-reference.py", "docs/metrics.md", "the metrics in code", "make docs"),
    ("gen-cli-reference.py", "docs/cli.md", "the command line parsers (argparse's layout is Python 3.11's)",
     "make docs"),
])
def test_the_generated_file_is_current(script, path, source, command):
    gen = _load(script)
    text = (REPO / path).read_text()
    if script == "gen-crd.py":  # a whole file
        assert REPO / path in gen.OUTPUTS
        generated = gen.render()
    else:  # the generated part of a page
        assert gen.PAGE == REPO / path
        generated = gen.render(text)
    assert generated == text, f"{path} is not current with {source}: run {command} (hack/{script})"


def test_crd_reference_names_every_field():
    import yaml

    gen = _load("gen-crd-reference.py")
    page = gen.PAGE.read_text()
    crd = yaml.safe_load(gen.CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]

    def paths(node, prefix):
        for name, child in (node.get("properties") or {}).items():
            yield f"{prefix}.{name}"
            yield from paths(child, f"{prefix}.{name}")
            if "properties" in (child.get("items") or {}):
                yield from paths(child["items"], f"{prefix}.{name}[]")

    missing = [p for part in ("spec", "status") for p in paths(schema["properties"][part], part)
               if f"`{p}`" not in page]
    assert missing == []


def test_every_series_has_an_example_query():
    gen = _load("gen-metrics-reference.py")
    examples = gen.PAGE.read_text().split("## Example queries", 1)[1]
    assert [name for name in gen.series_names() if name not in examples] == []
