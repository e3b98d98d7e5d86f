"""Queue names: the Python rule is the CRD's rule, character for character."""

from __future__ import annotations

import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

from stalledpolicy.keyspace import InvalidQueueName, QueueKeys, validate_queue_name

CRD = Path(__file__).resolve().parents[2] / "crds" / "stalledpolicies.yaml"
# RE2's \s (the CRD's pattern and CEL rule run on RE2): ASCII whitespace without \v
RE2_SPACE = "\t\n\f\r "


def crd_queue_schema() -> dict:
    crd = yaml.safe_load(CRD.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["queue"]


def crd_forbids(ch: str) -> bool:
    """``[^{}:\\s\\p{Z}\\p{Cc}]`` spelled out."""
    return ch in "{}:" or ch in RE2_SPACE or unicodedata.category(ch)[0] == "Z" \
        or unicodedata.category(ch) == "Cc"


def test_the_crd_pattern_is_the_one_mirrored_here():
    # if the CRD's rule changes, crd_forbids (and keyspace) must follow
    schema = crd_queue_schema()
    rules = [v["rule"] for v in schema["x-kubernetes-validations"]]
    assert r'self.matches(r"^[^{}:\s\p{Z}\p{Cc}]*$")' in rules and "size(self) > 0" in rules
    assert schema["maxLength"] == 128
    # one message per bad value: a pattern or minLength beside the rules reported twice
    assert "pattern" not in schema and "minLength" not in schema


def test_python_refuses_exactly_what_the_crd_refuses():
    disagree = []
    for code in range(sys.maxunicode + 1):
        ch = chr(code)
        if unicodedata.category(ch) == "Cs":
            continue  # not text: a CRD string cannot hold one (refused below)
        try:
            validate_queue_name(f"q{ch}q")
            refused = False
        except InvalidQueueName:
            refused = True
        if refused != crd_forbids(ch):
            disagree.append(f"U+{code:04X}")
    assert disagree == []


@pytest.mark.parametrize(("name", "shown"), [
    ("a\x00b", "U+0000, a control character"),
    ("a\x1fb", "U+001F, a control character"),
    ("a\x85b", "U+0085, a control character"),
    ("a\u00a0b", "U+00A0, whitespace"),
    ("a\u2028b", "U+2028, whitespace"),
    ("a\u3000b", "U+3000, whitespace"),
    ("a\tb", "U+0009, a control character"),
    ("a\udcffb", "U+DCFF, an undecodable byte"),
])
def test_control_characters_and_separators_are_refused_with_a_clear_message(name, shown):
    with pytest.raises(InvalidQueueName) as caught:
        validate_queue_name(name)
    message = str(caught.value)
    assert shown in message
    assert "may not contain '{', '}', ':', whitespace or control characters" in message
    with pytest.raises(InvalidQueueName):
        QueueKeys(name)


@pytest.mark.parametrize("name", ["orders", "emails-v2", "日本語", "tëst", "a.b_c/d", "x" * 128])
def test_ordinary_names_pass(name):
    assert validate_queue_name(name) == name


# -- lane names: the queue's rule plus ',' and '=' ------------------------------------

def crd_lane_name_schema() -> dict:
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    return spec["lanes"]["items"]["properties"]["name"]


def test_the_crd_lane_rule_is_the_one_mirrored_here():
    from stalledpolicy.keyspace import LANE_NAME_MAX

    schema = crd_lane_name_schema()
    rules = [v["rule"] for v in schema["x-kubernetes-validations"]]
    assert r'self.matches(r"^[^{}:,=\s\p{Z}\p{Cc}]*$")' in rules and "size(self) > 0" in rules
    assert schema["maxLength"] == LANE_NAME_MAX
    assert "pattern" not in schema and "minLength" not in schema


@pytest.mark.parametrize(("name", "words"), [
    ("bad:lane", "'bad:lane' contains ':'; lane (EchoMQ group) names may not contain"),
    ("a,b", "contains ','"),
    ("a=b", "contains '='"),
    ("{x}", "contains '{'"),
    ("a b", "U+0020, whitespace"),
    ("", "must not be empty"),
    ("l" * 129, "at most 128"),
])
def test_a_bad_lane_name_is_named_a_lane_with_the_lane_rules(name, words):
    from stalledpolicy.keyspace import InvalidLaneName, validate_lane_name

    with pytest.raises(InvalidLaneName) as caught:
        validate_lane_name(name)
    message = str(caught.value)
    assert message.startswith("lane: ") and words in message
    assert "queue name" not in message


def test_lane_names_of_the_crd_rule_are_accepted():
    from stalledpolicy.keyspace import validate_lane_name

    for name in ("imports", "tenant-42", "a.b_c", "l" * 128, "ünïcode"):
        assert validate_lane_name(name) == name
