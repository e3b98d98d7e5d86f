"""Condition helpers: transition times, merging, and the Ready summary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from stalledpolicy.policy.conditions import (
    READY,
    REDIS_REACHABLE,
    SWEEPER_AVAILABLE,
    Condition,
    condition_status,
    format_time,
    get_condition,
    set_condition,
    set_conditions,
)

T0 = datetime(2026, 12, 2, 15, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def test_a_new_condition_gets_every_field():
    conditions = set_condition([], SWEEPER_AVAILABLE, "True", "DeploymentAvailable", "1/1 replicas", 4, T0)
    assert conditions == [
        {
            "type": SWEEPER_AVAILABLE,
            "status": "True",
            "reason": "DeploymentAvailable",
            "message": "1/1 replicas",
            "lastTransitionTime": "2026-12-02T15:00:00Z",
            "observedGeneration": 4,
        }
    ]


def test_same_status_keeps_the_transition_time_but_takes_the_new_words():
    first = set_condition([], REDIS_REACHABLE, "False", "ConnectionRefused", "refused", 1, T0)
    second = set_condition(first, REDIS_REACHABLE, "False", "Timeout", "timed out", 2, T1)
    (condition,) = second
    assert condition["lastTransitionTime"] == "2026-12-02T15:00:00Z"
    assert (condition["reason"], condition["message"], condition["observedGeneration"]) == ("Timeout", "timed out", 2)


def test_a_status_change_moves_the_transition_time():
    first = set_condition([], REDIS_REACHABLE, "False", "ConnectionRefused", "refused", 1, T0)
    second = set_condition(first, REDIS_REACHABLE, "True", "Pinged", "PING ok", 1, T1)
    assert second[0]["lastTransitionTime"] == "2026-12-02T15:05:00Z"


def test_setting_the_same_condition_again_changes_nothing():
    first = set_condition([], READY, True, "Sweeping", "ok", 3, T0)
    assert set_condition(first, READY, True, "Sweeping", "ok", 3, T1) == first


def test_other_conditions_keep_their_place_and_the_input_is_not_mutated():
    conditions = set_condition([], SWEEPER_AVAILABLE, True, "DeploymentAvailable", "", 1, T0)
    conditions = set_condition(conditions, REDIS_REACHABLE, True, "Pinged", "", 1, T0)
    snapshot = [dict(c) for c in conditions]
    updated = set_condition(conditions, SWEEPER_AVAILABLE, False, "DeploymentUnavailable", "0/1", 2, T1)
    assert conditions == snapshot
    assert [c["type"] for c in updated] == [SWEEPER_AVAILABLE, REDIS_REACHABLE]
    assert updated[1] == snapshot[1]


def test_bools_and_lookups():
    conditions = set_condition(None, READY, False, "RedisUnreachable", "refused", None, T0)
    assert condition_status(conditions, READY) == "False"
    assert condition_status(conditions, SWEEPER_AVAILABLE) == "Unknown"
    assert get_condition(conditions, SWEEPER_AVAILABLE) is None
    assert "observedGeneration" not in get_condition(conditions, READY)


@pytest.mark.parametrize("status", ["true", "yes", "", None])
def test_a_bad_status_is_refused(status):
    with pytest.raises(ValueError, match="True, False or Unknown"):
        set_condition([], READY, status, "Sweeping", "", 1, T0)


@pytest.mark.parametrize("reason", ["", "has space", "trailing-dash", "9starts", "ends,"])
def test_a_reason_the_crd_would_refuse_is_refused(reason):
    with pytest.raises(ValueError, match="CamelCase"):
        set_condition([], READY, True, reason, "", 1, T0)


@pytest.mark.parametrize("type_", ["", "has space", "-Ready", "Ready.", "Bad_Prefix/Ready", "a/b/c"])
def test_a_type_the_crd_would_refuse_is_refused(type_):
    with pytest.raises(ValueError, match="status.conditions type must be a condition type"):
        set_condition([], type_, True, "Sweeping", "", 1, T0)


@pytest.mark.parametrize("type_",
                         [READY, SWEEPER_AVAILABLE, REDIS_REACHABLE, "example.com/SweeperAvailable", "a_b.c-d"])
def test_a_type_the_crd_takes_is_taken(type_):
    assert set_condition([], type_, True, "Sweeping", "", 1, T0)[0]["type"] == type_


def test_a_bad_reason_is_refused_in_the_words_of_the_crds_rule():
    """The CRD's rule on a condition's reason (generated from conditions.py's
    pattern and words) and set_condition refuse alike, in the same words."""
    from stalledpolicy.policy import conditions

    with pytest.raises(ValueError) as info:
        set_condition([], READY, True, "not a reason", "", 1, T0)
    assert f"status.conditions reason {conditions.CONDITION_REASON_FIX}" in str(info.value)


def test_a_huge_message_is_cut_to_the_crd_limit():
    (condition,) = set_condition([], READY, False, "Failed", "x" * 40000, 1, T0)
    assert len(condition["message"]) == 32768


def test_naive_times_are_refused_and_strings_pass_through():
    with pytest.raises(ValueError, match="timezone"):
        format_time(datetime(2026, 1, 1))
    assert format_time("2026-01-01T00:00:00Z") == "2026-01-01T00:00:00Z"
    assert format_time(datetime(2026, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))) == "2026-01-01T00:00:00Z"


def test_set_conditions_applies_several_at_once():
    conditions = set_conditions(
        [],
        [Condition(SWEEPER_AVAILABLE, "True", "DeploymentAvailable"),
         Condition(REDIS_REACHABLE, "False", "Timeout", "t")],
        5, T0,
    )
    assert [(c["type"], c["status"], c["observedGeneration"]) for c in conditions] == [
        (SWEEPER_AVAILABLE, "True", 5),
        (REDIS_REACHABLE, "False", 5),
    ]
