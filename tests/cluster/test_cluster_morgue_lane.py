"""A lane list while the queue's slot migrates: a row that has not moved yet
reads as absent on the importing node, so the scan asks its absence with
`dead` (lib/refusals, here) and the call is refused, never a row silently left
out of the page or of the lane's total."""

from __future__ import annotations

import pytest
import redis

from stalledpolicy import engine
from stalledpolicy.redis_url import errors
from tests.cluster.test_cluster import _cli, morgue_of_three, slot_migrating

pytestmark = pytest.mark.redis


@pytest.mark.parametrize("lane", ["g", ""])
def test_a_lane_list_never_leaves_out_a_row_that_has_not_moved_yet(redis_cluster, lane):
    """`list --lane g` walked the morgue twice and the second walk (stats) was
    refused; one walk reading a row's `group` alone took a row not moved yet
    (absent on the importing node) for one of no lane: a page and a total short
    of it, exit 0."""
    client, queue, keys = morgue_of_three(redis_cluster, "importing-lane", lane or None)
    with slot_migrating(client, queue, [keys.dead, keys.job("JOB1")]):
        for read in (engine.morgue_list, engine.morgue_page):
            with pytest.raises(redis.ResponseError) as refusal:
                read(client, queue, lane=lane)
            assert errors.is_slot_migrating(refusal.value), str(refusal.value)
        result = _cli("morgue", "list", "--redis-url", redis_cluster.url, "--queue", queue, "--lane", lane)
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert f"the slot of queue {queue} is being migrated" in result.stderr, result.stderr
    # on the node the slot is leaving, a row already moved is refused too
    with slot_migrating(client, queue, [keys.job("JOB2")]):
        with pytest.raises(redis.ResponseError, match="non local key"):
            engine.morgue_page(client, queue, lane=lane)
    assert engine.morgue_page(client, queue, lane=lane) == engine.MorguePage(
        engine.morgue_list(client, queue, lane=lane), 3)
    client.close()
