"""Generated documentation is current: each generator's output equals the committed file.

A failure names the command that brings the file up to date.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _load(script: str):
    path = REPO / "hack" / script
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_crd_reference_is_current():
    gen = _load("gen-crd-reference.py")
    page = gen.PAGE.read_text()
    assert gen.render(page) == page, (
        "docs/reference.md is not current with crds/stalledpolicies.yaml: run make docs "
        "(hack/gen-crd-reference.py)")


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


def test_metrics_reference_is_current():
    gen = _load("gen-metrics-reference.py")
    page = gen.PAGE.read_text()
    assert gen.render(page) == page, (
        "docs/metrics.md is not current with the metrics in code: run make docs "
        "(hack/gen-metrics-reference.py)")


def test_every_series_has_an_example_query():
    gen = _load("gen-metrics-reference.py")
    examples = gen.PAGE.read_text().split("## Example queries", 1)[1]
    assert [name for name in gen.series_names() if name not in examples] == []


def test_cli_reference_is_current():
    gen = _load("gen-cli-reference.py")
    page = gen.PAGE.read_text()
    assert gen.render(page) == page, (
        "docs/cli.md is not current with the command line parsers: run make docs "
        "(hack/gen-cli-reference.py; argparse's layout is Python 3.11's)")
