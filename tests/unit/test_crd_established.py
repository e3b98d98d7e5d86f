"""Waiting for a CRD to be Established tolerates a CRD the API server has not
given a status yet (where ``kubectl wait --for=condition=Established`` fails at
once: the demo failed so in a CI run of 3 December)."""

from __future__ import annotations

import json
import subprocess

import pytest

from stalledpolicy.devenv import controlplane
from stalledpolicy.devenv.controlplane import ControlPlaneError, crd_established, wait_crd_established

ESTABLISHED = {"status": {"conditions": [{"type": "NamesAccepted", "status": "True"},
                                         {"type": "Established", "status": "True"}]}}


@pytest.mark.parametrize("crd, expected", [
    ({}, False),
    ({"status": None}, False),
    ({"status": {}}, False),
    ({"status": {"conditions": None}}, False),
    ({"status": {"conditions": [{"type": "NamesAccepted", "status": "True"}]}}, False),
    ({"status": {"conditions": [{"type": "Established", "status": "False"},
                                {"type": "NamesAccepted", "status": "True"}]}}, False),
    (ESTABLISHED, True),
])
def test_crd_established_reads_the_conditions(crd, expected):
    assert crd_established(crd) is expected


class ScriptedKubectl:
    """Answers ``kubectl get crd/... -o json`` with the given bodies in turn (the last repeats)."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.calls: list[tuple] = []

    def __call__(self, *args, check=True):
        assert check is False
        self.calls.append(args)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, str):
            return subprocess.CompletedProcess(args, 1, "", answer)
        return subprocess.CompletedProcess(args, 0, json.dumps(answer), "")


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch):
    monkeypatch.setattr(controlplane.time, "sleep", lambda _: None)


def test_waits_through_a_missing_crd_and_a_status_less_one():
    kubectl = ScriptedKubectl('Error from server (NotFound): customresourcedefinitions "x" not found',
                              {"metadata": {"name": "x"}}, ESTABLISHED)
    wait_crd_established(kubectl, "x", timeout=30)
    assert len(kubectl.calls) == 3
    assert kubectl.calls[0] == ("get", "crd/x", "-o", "json")


def test_gives_up_naming_the_crd_and_the_last_answer(monkeypatch):
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(controlplane.time, "monotonic", lambda: next(clock))
    kubectl = ScriptedKubectl('Error from server (NotFound): customresourcedefinitions "x" not found')
    with pytest.raises(ControlPlaneError, match=r'CRD x not Established after 60s \(Error from server \(NotFound\)'):
        wait_crd_established(kubectl, "x", timeout=60)
