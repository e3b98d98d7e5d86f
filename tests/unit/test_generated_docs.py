"""Generated documentation is current: each generator's output equals the committed file.

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


@pytest.mark.parametrize("script, page, source", [
    ("gen-crd-reference.py", "docs/reference.md", "crds/stalledpolicies.yaml"),
    ("gen-metrics-reference.py", "docs/metrics.md", "the metrics in code"),
    ("gen-cli-reference.py", "docs/cli.md", "the command line parsers (argparse's layout is Python 3.11's)"),
])
def test_the_generated_part_is_current(script, page, source):
    gen = _load(script)
    assert gen.PAGE == REPO / page
    text = gen.PAGE.read_text()
    assert gen.render(text) == text, f"{page} is not current with {source}: run make docs (hack/{script})"


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
