"""The profiler's variants patch lines of the shipped sweep script; when the
script changes under them they must be updated, not silently skipped."""

import importlib.util
from pathlib import Path

from stalledpolicy.lua import script

BENCH = Path(__file__).resolve().parents[2] / "bench" / "profile_script.py"


def _profile_module():
    spec = importlib.util.spec_from_file_location("profile_script", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_profiler_variant_still_finds_the_lines_it_patches():
    profile = _profile_module()
    body = script("sweep").body
    built = profile.variants(body)  # raises SystemExit naming the line that moved
    assert set(built) == set(profile.VARIANTS)
    changed = {name for name, variant in built.items() if variant != body}
    assert changed == set(profile.VARIANTS) - {"as shipped"}
