"""EventRecorder against a fake core API: repeats are counted on one Event
(client-go's correlator), a flood of distinct messages of one reason is one
combined Event, a vanished Event is created anew, and the caches stay bounded."""

from __future__ import annotations

import itertools
import json
import threading

import pytest
from kubernetes.client.exceptions import ApiException

from stalledpolicy.controller.events import COMBINED_PREFIX, DEAD_LETTERED, EventRecorder, dead_letter_growth_message


class Response:
    def __init__(self, body: dict) -> None:
        self.data = json.dumps(body).encode()


class FakeCore:
    """create/patch of core/v1 Events, kept in a dict by (namespace, name)."""

    def __init__(self) -> None:
        self.events: dict[tuple[str, str], dict] = {}
        self.calls: list[tuple[str, str]] = []
        self.patch_error: int | None = None
        self.create_error: int | None = None
        self._names = itertools.count(1)
        self._lock = threading.Lock()

    def create_namespaced_event(self, namespace, body, **_):
        with self._lock:
            if self.create_error is not None:
                self.calls.append(("create-refused", ""))
                raise ApiException(status=self.create_error, reason="refused")
            name = body["metadata"]["generateName"] + f"{next(self._names):05x}"
            stored = json.loads(json.dumps(body))
            stored["metadata"] = {"name": name, "namespace": namespace}
            self.events[(namespace, name)] = stored
            self.calls.append(("create", name))
            return Response(stored)

    def patch_namespaced_event(self, name, namespace, body, **_):
        with self._lock:
            self.calls.append(("patch", name))
            if self.patch_error is not None:
                raise ApiException(status=self.patch_error, reason="refused")
            if (namespace, name) not in self.events:
                raise ApiException(status=404, reason="Not Found")
            self.events[(namespace, name)].update(body)
            return Response(self.events[(namespace, name)])

    def listed(self) -> list[dict]:
        return list(self.events.values())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def policy(name: str = "orders", uid: str = "u-1") -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid}}


@pytest.fixture
def core():
    return FakeCore()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def recorder(core, clock):
    return EventRecorder(core, clock=clock)


def test_a_repeat_patches_the_count_of_the_same_event(recorder, core, clock):
    recorder.post(policy(), "Warning", "RedisUnreachable", "cannot reach db:6379")
    clock.now += 60
    recorder.post(policy(), "Warning", "RedisUnreachable", "cannot reach db:6379")
    clock.now += 60
    recorder.post(policy(), "Warning", "RedisUnreachable", "cannot reach db:6379")
    [event] = core.listed()
    assert event["count"] == 3 and event["message"] == "cannot reach db:6379"
    assert [call for call, _ in core.calls] == ["create", "patch", "patch"]
    assert event["lastTimestamp"] >= event["firstTimestamp"]


def test_a_different_message_type_reason_or_policy_is_a_new_event(recorder, core):
    recorder.post(policy(), "Warning", "ApplyFailed", "HTTP 422: one")
    recorder.post(policy(), "Warning", "ApplyFailed", "HTTP 422: two")
    recorder.post(policy(), "Warning", "NameConflict", "HTTP 422: one")
    recorder.post(policy(), "Normal", "ApplyFailed", "HTTP 422: one")
    recorder.post(policy("other", "u-2"), "Warning", "ApplyFailed", "HTTP 422: one")
    recorder.post(policy("orders", "u-3"), "Warning", "ApplyFailed", "HTTP 422: one")  # recreated policy
    assert [call for call, _ in core.calls] == ["create"] * 6
    assert all(e["count"] == 1 for e in core.listed())


def test_a_repeat_after_the_window_is_a_new_event(recorder, core, clock):
    recorder.post(policy(), "Normal", "Replayed", "3 jobs replayed")
    clock.now += 601
    recorder.post(policy(), "Normal", "Replayed", "3 jobs replayed")
    assert [call for call, _ in core.calls] == ["create", "create"]


def test_an_event_gone_on_patch_is_created_anew(recorder, core):
    recorder.post(policy(), "Warning", "RedisUnreachable", "down")
    core.events.clear()  # expired (event TTL) or deleted by hand
    recorder.post(policy(), "Warning", "RedisUnreachable", "down")
    [event] = core.listed()
    assert event["count"] == 1
    assert [call for call, _ in core.calls] == ["create", "patch", "create"]
    recorder.post(policy(), "Warning", "RedisUnreachable", "down")  # the new one is counted on
    [event] = core.listed()
    assert event["count"] == 2 and core.calls[-1] == ("patch", event["metadata"]["name"])


def test_a_refused_patch_is_logged_dropped_and_the_next_repeat_patches_again(recorder, core, caplog):
    recorder.post(policy(), "Warning", "RedisUnreachable", "down")
    core.patch_error = 500
    recorder.post(policy(), "Warning", "RedisUnreachable", "down")  # must not raise
    assert "could not post event" in caplog.text
    core.patch_error = None
    recorder.post(policy(), "Warning", "RedisUnreachable", "down")
    [event] = core.listed()
    assert event["count"] == 2  # what the server holds: the refused one is not counted


def test_a_flood_of_distinct_messages_of_one_reason_is_one_combined_event(recorder, core, clock):
    for size in range(1, 361):  # an hour of a poison-job storm, one growth every 10 s
        clock.now += 10
        recorder.post(policy(), "Warning", DEAD_LETTERED, dead_letter_growth_message("q", size - 1, size))
    dead = [e for e in core.listed() if e["reason"] == DEAD_LETTERED]
    assert len(dead) == 11
    combined = [e for e in dead if e["message"].startswith(COMBINED_PREFIX)]
    [combined] = combined
    assert combined["count"] == 350
    assert combined["message"] == COMBINED_PREFIX + dead_letter_growth_message("q", 359, 360)
    # other reasons of the same policy are not held back by the flood
    recorder.post(policy(), "Warning", "RedisUnreachable", "down")
    assert core.calls[-1][0] == "create"


def test_a_message_among_the_first_similar_ones_still_counts_on_its_own_event(recorder, core):
    for n in range(12):
        recorder.post(policy(), "Warning", "ApplyFailed", f"refusal {n}")
    recorder.post(policy(), "Warning", "ApplyFailed", "refusal 0")
    [first] = [e for e in core.listed() if e["message"] == "refusal 0"]
    assert first["count"] == 2
    assert len(core.listed()) == 11


def test_messages_whose_post_failed_do_not_use_up_the_similar_budget(recorder, core, caplog):
    core.create_error = 503  # the API server is down: nothing is posted
    for n in range(10):
        recorder.post(policy(), "Warning", "ApplyFailed", f"refusal {n}")
    assert core.listed() == [] and caplog.text.count("could not post event") == 10
    core.create_error = None
    recorder.post(policy(), "Warning", "ApplyFailed", "refusal 10")
    [event] = core.listed()
    assert event["message"] == "refusal 10"  # its own Event, not a combined one
    for n in range(9):  # nine more distinct ones: ten in the window, none combined yet
        recorder.post(policy(), "Warning", "ApplyFailed", f"again {n}")
    assert not any(e["message"].startswith(COMBINED_PREFIX) for e in core.listed())
    recorder.post(policy(), "Warning", "ApplyFailed", "the eleventh")
    assert core.listed()[-1]["message"] == COMBINED_PREFIX + "the eleventh"


def test_similar_messages_are_combined_only_within_the_window(recorder, core, clock):
    for n in range(10):
        recorder.post(policy(), "Warning", "ApplyFailed", f"refusal {n}")
    clock.now += 601
    recorder.post(policy(), "Warning", "ApplyFailed", "refusal 10")
    assert not any(e["message"].startswith(COMBINED_PREFIX) for e in core.listed())


def test_the_caches_stay_bounded_and_the_oldest_key_goes_first(core, clock):
    recorder = EventRecorder(core, clock=clock, cache_size=3)
    for n in range(50):
        recorder.post(policy(f"p{n}", f"u{n}"), "Warning", "RedisUnreachable", "down")
    assert recorder.cached() == (3, 3)
    calls = len(core.calls)
    recorder.post(policy("p49", "u49"), "Warning", "RedisUnreachable", "down")  # still remembered
    recorder.post(policy("p0", "u0"), "Warning", "RedisUnreachable", "down")    # pushed out
    assert [call for call, _ in core.calls[calls:]] == ["patch", "create"]
    assert recorder.cached() == (3, 3)


def test_concurrent_repeats_are_one_event(recorder, core):
    threads = [threading.Thread(target=recorder.post,
                                args=(policy(), "Warning", "RedisUnreachable", "down"))
               for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    [event] = core.listed()
    assert event["count"] == 16


def test_a_password_in_a_url_never_reaches_the_event(recorder, core):
    recorder.post(policy(), "Warning", "RedisUnreachable", "cannot reach redis://:hunter2@db:6379/0")
    recorder.post(policy(), "Warning", "RedisUnreachable", "cannot reach redis://:hunter2@db:6379/0")
    assert "hunter2" not in json.dumps(core.listed())
    [event] = core.listed()
    assert event["count"] == 2


def test_long_messages_are_cut_also_when_combined(recorder, core):
    for n in range(11):
        recorder.post(policy(), "Warning", "ApplyFailed", f"{n:02d}" + "x" * 5000)
    assert all(len(e["message"]) <= 1024 for e in core.listed())
    assert any(e["message"].startswith(COMBINED_PREFIX) for e in core.listed())
