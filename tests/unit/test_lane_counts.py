"""The sweep reply's lanes: one string, ``<#group>:<group><recovered>,<dead_lettered>;``
per lane (scripts/sweep.lua), read back by name."""

from __future__ import annotations

import pytest

from stalledpolicy.engine.sweep import LaneCounts, SweepResult, lane_counts


def test_each_lane_is_read_back_with_its_counts():
    assert lane_counts(b"3:g0012,1;1:a0,7;") == {"g00": LaneCounts(12, 1), "a": LaneCounts(0, 7)}


def test_names_holding_the_separators_are_read_by_their_length():
    name = "a:1,2;b"
    blob = f"{len(name)}:{name}5,6;".encode()
    assert lane_counts(blob) == {name: LaneCounts(5, 6)}


def test_a_decoding_client_gets_the_same_lanes():
    # the length counts bytes: é is two of them
    assert lane_counts("2:é3,4;") == {"é": LaneCounts(3, 4)}


def test_a_client_keeping_bytes_as_surrogates_keeps_those_lanes_apart():
    # the sweeper's client decodes with surrogateescape: b"l\xfe" and b"l\xff" stay two lanes
    blob = b"2:l\xfe1,0;2:l\xff2,0;4:l\xef\xbf\xbd1,0;".decode("utf-8", "surrogateescape")
    assert lane_counts(blob) == dict([("l\udcfe", LaneCounts(1, 0)), ("l\udcff", LaneCounts(2, 0)),
                                      ("l\ufffd", LaneCounts(1, 0))])  # (ruff sees lone surrogates as one key)


def test_lanes_that_decode_alike_add_up():
    # two lanes that differ in a byte that is not UTF-8 show as one name (U+FFFD):
    # their counts add up, so the totals still match the jobs moved
    blob = b"2:a\xff1,0;2:a\xfe2,3;"
    assert lane_counts(blob) == {"a\ufffd": LaneCounts(3, 3)}


def test_no_lane_is_an_empty_reply():
    assert lane_counts(b"") == {}


def test_a_truncated_reply_is_an_error_not_a_guess():
    with pytest.raises(ValueError):
        lane_counts(b"3:g0012")


# ------------------------------------------- a drain's total: add in place, merge as a copy


def call(recovered: int, lanes: dict[str, LaneCounts], problems: list[str] | None = None, **fields) -> SweepResult:
    return SweepResult(recovered=recovered, lanes=lanes, problems=problems or [], calls=1, **fields)


def test_add_counts_a_later_call_in_place_and_shares_nothing_with_it():
    total = SweepResult()
    first = call(3, {"a": LaneCounts(2, 0), "b": LaneCounts(1, 1)}, ["p"], dead_lettered=1, server_us=90,
                 server_now_ms=10, next_at_ms=20, more=True)
    second = call(1, {"a": LaneCounts(1, 0)}, ["p", "q"], server_us=40, server_now_ms=11, next_at_ms=None)
    total.add(first)
    total.add(second)
    assert (total.recovered, total.dead_lettered, total.calls, total.server_us) == (4, 1, 2, 130)
    assert total.lanes == {"a": LaneCounts(3, 0), "b": LaneCounts(1, 1)}
    assert total.problems == ["p", "q"]
    assert (total.more, total.server_now_ms, total.next_at_ms) == (False, 11, None)  # the last call's
    assert first.lanes == {"a": LaneCounts(2, 0), "b": LaneCounts(1, 1)}  # the calls' own counts unchanged


def test_merge_leaves_both_results_as_they_were():
    first = call(3, {"a": LaneCounts(2, 0)}, ["p"])
    second = call(1, {"a": LaneCounts(1, 0)}, ["q"])
    both = first.merge(second)
    assert (both.recovered, both.calls, both.lanes, both.problems) == (4, 2, {"a": LaneCounts(3, 0)}, ["p", "q"])
    assert (first.recovered, first.lanes, first.problems) == (3, {"a": LaneCounts(2, 0)}, ["p"])
    assert (second.recovered, second.lanes, second.problems) == (1, {"a": LaneCounts(1, 0)}, ["q"])


def test_a_result_of_no_call_keeps_the_last_server_times():
    total = SweepResult()
    total.add(call(1, {}, server_now_ms=5, next_at_ms=9))
    total.add(SweepResult())
    assert (total.server_now_ms, total.next_at_ms) == (5, 9)
