"""The ``queues.emq.dev/replay-lane`` annotation is judged as a lane, with the
lane rules (the CRD's spec.lanes[].name: also no ',' or '='), and says so."""

from __future__ import annotations

import pytest

from stalledpolicy.controller import REPLAY_ANNOTATION, REPLAY_LANE_ANNOTATION
from stalledpolicy.controller.replay import InvalidReplayRequest, ReplayRequest, requested_replay


@pytest.mark.parametrize(("lane", "bad"), [("bad:lane", "':'"), ("a,b", "','"), ("a=b", "'='"), ("{x}", "'{'")])
def test_a_bad_replay_lane_is_named_a_lane_and_given_the_lane_rules(lane, bad):
    with pytest.raises(InvalidReplayRequest) as caught:
        requested_replay({REPLAY_ANNOTATION: "t", REPLAY_LANE_ANNOTATION: lane}, None)
    message = str(caught.value)
    assert message == (f"annotation {REPLAY_LANE_ANNOTATION}: {lane!r} contains {bad}; lane (EchoMQ group) "
                       "names may not contain '{', '}', ':', ',', '=', whitespace or control characters")
    assert "queue name" not in message


def test_a_good_or_empty_replay_lane_is_taken():
    assert requested_replay({REPLAY_ANNOTATION: "t", REPLAY_LANE_ANNOTATION: "imports"}, None) == \
        ReplayRequest("t", "imports")
    # empty: no lane (the whole morgue), as before
    assert requested_replay({REPLAY_ANNOTATION: "t", REPLAY_LANE_ANNOTATION: ""}, None) == ReplayRequest("t", None)


def test_a_token_served_before_never_replays_again_and_the_history_is_bounded():
    from stalledpolicy.controller.replay import SERVED_HISTORY, served_tokens, with_served

    assert requested_replay({REPLAY_ANNOTATION: "r1"}, ["r1", "r2"]) is None
    assert requested_replay({REPLAY_ANNOTATION: "r3"}, ["r1", "r2"]) == ReplayRequest("r3", None)
    assert requested_replay({REPLAY_ANNOTATION: "r1"}, "r1") is None  # the last one alone, as before
    tokens = []
    for n in range(SERVED_HISTORY + 4):
        tokens = with_served(tokens, f"t{n}")
    assert len(tokens) == SERVED_HISTORY and tokens[-1] == f"t{SERVED_HISTORY + 3}" and "t3" not in tokens
    assert with_served(["a", "b", "c"], "a") == ["b", "c", "a"]
    # a status written before servedTokens existed: its token; malformed entries ignored
    assert served_tokens({"token": "r1"}) == ["r1"]
    assert served_tokens({"token": "r2", "servedTokens": ["r1", 5, "r2"]}) == ["r1", "r2"]
    assert served_tokens(None) == [] and served_tokens({"servedTokens": "x"}) == []
