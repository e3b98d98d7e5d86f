"""What another writer adds to the sweeper container and the sweeper would run
with (``args``, ``STALLEDPOLICY_*`` variables the policy does not set) is taken
out after each apply: server-side apply leaves another manager's fields alone,
so a hand-added ``--max-stalled 9`` ran beside a policy that said 1, its status
Ready (reviewer's reproduction on the control plane)."""

from __future__ import annotations

import copy

import pytest

from stalledpolicy.controller.apply import foreign_settings_patch
from tests.unit.test_builder import build, container


def apply_patch(document: dict, ops: list[dict]) -> dict:
    """RFC 6902 for the operations the patch uses (test, remove), as the API server applies them."""
    document = copy.deepcopy(document)
    for op in ops:
        *parents, last = op["path"].strip("/").split("/")
        target = document
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        key = int(last) if isinstance(target, list) else last
        if op["op"] == "test":
            assert target[key] == op["value"], op
        elif op["op"] == "remove":
            del target[key]
    return document


def test_an_untouched_sweeper_needs_no_patch():
    desired = build()
    assert foreign_settings_patch(desired, desired) == []


def test_args_and_foreign_sweeper_variables_are_taken_out_and_the_rest_kept():
    desired = build()
    stored = copy.deepcopy(desired)
    ours = [e["name"] for e in container(desired)["env"]]
    sweeper = container(stored)
    sweeper["args"] = ["--max-stalled", "9"]
    sweeper["env"].insert(1, {"name": "STALLEDPOLICY_LANES", "value": "vip=1"})
    sweeper["env"].append({"name": "HTTPS_PROXY", "value": "http://proxy:3128"})
    sweeper["env"].append({"name": "STALLEDPOLICY_BATCH_SIZE_X", "value": "1"})
    sweeper["envFrom"] = [{"configMapRef": {"name": "sweeper-overrides"}}]
    ops = foreign_settings_patch(stored, desired)
    fixed = container(apply_patch(stored, ops))
    assert "args" not in fixed and "envFrom" not in fixed
    assert [e["name"] for e in fixed["env"]] == ours + ["HTTPS_PROXY"]


def test_a_write_in_between_fails_the_patch_rather_than_removing_the_wrong_entry():
    desired = build()
    stored = copy.deepcopy(desired)
    container(stored)["env"].append({"name": "STALLEDPOLICY_LANES", "value": "vip=1"})
    ops = foreign_settings_patch(stored, desired)
    moved = copy.deepcopy(stored)
    container(moved)["env"].insert(0, {"name": "TZ", "value": "UTC"})  # indexes shifted
    with pytest.raises(AssertionError):
        apply_patch(moved, ops)


def test_a_deployment_without_the_sweeper_container_is_left_alone():
    desired = build()
    stored = copy.deepcopy(desired)
    container(stored)["name"] = "renamed"
    assert foreign_settings_patch(stored, desired) == []
