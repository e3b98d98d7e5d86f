"""The chart's README.md is what helm-docs writes from README.md.gotmpl and values.yaml.

helm-docs is built from its pinned Go module (hack/helm-docs/build.sh, run by
`make test` before pytest; run here too when the cache lacks it, which takes
seconds). Without it the test fails, naming the fix: it is never skipped, so a
CI machine that cannot build it does not pass the check unseen.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "stalledpolicy-operator"
RUN = REPO / "hack" / "helm-docs" / "run.sh"


def _helm_docs(*args: str) -> str:
    try:
        done = subprocess.run(["bash", str(RUN), *args], capture_output=True, text=True, timeout=540)
    except subprocess.TimeoutExpired:
        pytest.fail("hack/helm-docs/run.sh did not finish in 540 s (building helm-docs?)")
    if done.returncode != 0:
        pytest.fail(
            "helm-docs could not be built or run (it needs Go 1.26+ and the Go module proxy; "
            f"build it with: make helm-docs):\n{done.stderr}")
    return done.stdout


def test_chart_readme_is_what_helm_docs_generates():
    generated = _helm_docs("--dry-run")
    committed = (CHART / "README.md").read_text()
    assert generated.strip(), "helm-docs printed nothing for the chart"
    assert generated == committed, (
        "charts/stalledpolicy-operator/README.md differs from what helm-docs generates from "
        "README.md.gotmpl and values.yaml: run make chart-docs and commit the result")


def _leaves(values: dict, prefix: str = "") -> list[str]:
    found = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            found += _leaves(value, f"{path}.")
        else:
            found.append(path)
    return found


def test_every_value_has_a_description_in_the_chart_readme():
    readme = (CHART / "README.md").read_text()
    rows = {}
    for line in readme.splitlines():
        match = re.match(r"^\| (\S+) \| \w+ \| .* \| (.*) \|$", line)
        if match:
            rows[match.group(1)] = match.group(2).strip()
    assert rows, "no values table in the chart's README"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # a row documents a leaf, or a whole object (resources) and with it everything under it
    undocumented = [leaf for leaf in _leaves(values)
                    if not any(leaf == key or leaf.startswith(key + ".") for key in rows)]
    assert undocumented == [], "values without a '# --' comment in values.yaml"
    assert [key for key, text in rows.items() if not text] == [], "values with an empty description"
