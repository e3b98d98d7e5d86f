"""The StalledPolicy object as its CRD declares it: the root (``apiVersion``,
``kind``, ``metadata``, ``spec``, ``status``) and the ``status`` models.

hack/gen-crd.py writes the CRD's schema from :class:`StalledPolicy` (its
``spec`` is :class:`~.models.StalledPolicySpec`); the markers are
:mod:`.schema`'s. The status models declare what the API server stores: the
operator writes status as plain dicts (:mod:`.conditions`, the controller's
status document) and never validates it with them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from stalledpolicy.keyspace import LANE_NAME_MAX
from stalledpolicy.kube_names import DNS_SUBDOMAIN_MAX_LENGTH
from stalledpolicy.policy.conditions import (
    CONDITION_REASON_FIX,
    CONDITION_REASON_PATTERN,
    CONDITION_TYPE_FIX,
    CONDITION_TYPE_PATTERN,
    MESSAGE_MAX,
)
from stalledpolicy.policy.models import MAX_LANES, StalledPolicySpec
from stalledpolicy.policy.schema import Rule, crd, listed_by

# A count the operator reads from Redis (int64, as Kubernetes' own counts).
Count = Annotated[int, Field(json_schema_extra=crd(format="int64"))]
CONDITIONS_MAX = 16
SERVED_TOKENS_MAX = 16


class _Declared(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True)


class StatusCondition(_Declared):
    # The type and reason are judged by rules only (one message per bad value: no
    # pattern or minLength beside them), the very ones set_condition applies.
    type: str = Field(
        max_length=316, description="The condition's type (Ready, SweeperAvailable, RedisReachable).",
        json_schema_extra=crd(Rule(f'self.matches(r"{CONDITION_TYPE_PATTERN}")',
                                   f"status.conditions type {CONDITION_TYPE_FIX}")),
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(
        max_length=1024, description="A CamelCase word for the last transition's cause.",
        json_schema_extra=crd(Rule(f'self.matches(r"{CONDITION_REASON_PATTERN}")',
                                   f"status.conditions reason {CONDITION_REASON_FIX}")),
    )
    message: str = Field(max_length=MESSAGE_MAX, description="What happened, for humans.")
    last_transition_time: datetime = Field(alias="lastTransitionTime", description="When status last changed.")
    observed_generation: Count | None = Field(
        default=None, ge=0, alias="observedGeneration",
        description="The metadata.generation the condition was set for.",
    )


class LaneStatus(_Declared):
    name: str = Field(max_length=LANE_NAME_MAX, description="The lane.")
    pending: Count | None = Field(default=None, description="The lane's jobs waiting to be claimed now.")
    dead_lettered: Count | None = Field(
        default=None, alias="deadLettered", description="The lane's jobs dead-lettered by the sweeper, in total.",
    )
    recovered: Count | None = Field(default=None, description="The lane's jobs recovered by the sweeper, in total.")


class LastReplay(_Declared):
    token: str | None = Field(default=None, max_length=DNS_SUBDOMAIN_MAX_LENGTH,
                              description="The annotation value that asked for the replay.")
    lane: str | None = Field(default=None, max_length=LANE_NAME_MAX,
                             description="The lane replayed, if the replay was limited to one.")
    replayed: Count | None = Field(default=None,
                                   description="Jobs moved from the morgue back to their queue or lane.")
    time: datetime | None = Field(default=None, description="When the replay ran.")
    served_tokens: list[Annotated[str, Field(max_length=DNS_SUBDOMAIN_MAX_LENGTH)]] | None = Field(
        default=None, alias="servedTokens", max_length=SERVED_TOKENS_MAX,
        description="The last annotation values served (oldest first, token last): none of them replays again.",
    )


class StalledPolicyStatus(_Declared):
    observed_generation: Count | None = Field(
        default=None, alias="observedGeneration", description="The metadata.generation this status describes.",
    )
    conditions: list[StatusCondition] | None = Field(
        default=None, max_length=CONDITIONS_MAX,
        description="Ready (the sweeper is available and Redis is reachable, for the current generation), "
                    "SweeperAvailable, RedisReachable.",
        json_schema_extra=crd(**listed_by("type")),
    )
    dead_letters: Count | None = Field(
        default=None, alias="deadLetters", description="Jobs in the queue's morgue (emq:{queue}:dead) now.",
    )
    pending: Count | None = Field(
        default=None,
        description="Jobs waiting to be claimed now in the queue's flat pending set (emq:{queue}:pending); "
                    "lanes' waiting jobs are in status.lanes.",
    )
    active: Count | None = Field(
        default=None, description="Jobs claimed by workers now (their leases may have lapsed).",
    )
    recovered_total: Count | None = Field(
        default=None, alias="recoveredTotal",
        description="Stalled jobs the sweepers returned to their queue or lane, in total (counted in Redis, "
                    "emq:{queue}:sweeper:totals).",
    )
    dead_lettered_total: Count | None = Field(
        default=None, alias="deadLetteredTotal",
        description="Stalled jobs the sweepers dead-lettered at their budget, in total (counted in Redis, "
                    "emq:{queue}:sweeper:totals).",
    )
    orphans_total: Count | None = Field(
        default=None, alias="orphansTotal",
        description="Lapsed leases whose job row had vanished (dropped from active, never recreated).",
    )
    quarantined_total: Count | None = Field(
        default=None, alias="quarantinedTotal",
        description="Malformed job rows the sweeper set aside instead of failing the sweep.",
    )
    uncounted_lapses_total: Count | None = Field(
        default=None, alias="uncountedLapsesTotal",
        description="Lapsed leases another reaper (EchoMQ's consumers reap on every loop) returned to the queue "
                    "before the sweep could count the stall, in total. Those stalls did not count toward "
                    "maxStalled; a growing figure means the budget is leaking (see the sweeper's "
                    "stalledpolicy_lapses_uncounted metric).",
    )
    lanes: list[LaneStatus] | None = Field(
        default=None, max_length=MAX_LANES, description="Numbers of each lane listed in spec.lanes.",
        json_schema_extra=crd(**listed_by("name")),
    )
    last_replay: LastReplay | None = Field(
        default=None, alias="lastReplay",
        description="The last morgue replay asked for with the queues.emq.dev/replay annotation (done once per "
                    "token value).",
    )
    last_update_time: datetime | None = Field(
        default=None, alias="lastUpdateTime", description="When the operator last changed this status.",
    )
    sweeper_deployment: str | None = Field(
        default=None, alias="sweeperDeployment", max_length=DNS_SUBDOMAIN_MAX_LENGTH,
        description="The name of the sweeper Deployment (in the policy's namespace).",
    )


class StalledPolicy(_Declared):
    """The whole object; its own description is :data:`.crd.DESCRIPTION`."""

    api_version: str | None = Field(
        default=None, alias="apiVersion",
        description="APIVersion defines the versioned schema of this representation of an object.",
    )
    kind: str | None = Field(
        default=None,
        description="Kind is a string value representing the REST resource this object represents.",
    )
    # Kubernetes' own: the CRD says only that it is an object.
    metadata: dict[str, Any] | None = None
    spec: StalledPolicySpec = Field(
        description="The queue to sweep, its stall budget, how often to sweep, per-lane budgets, where Redis is, "
                    "and how to run the sweeper.",
    )
    status: StalledPolicyStatus | None = Field(
        default=None, description="What the operator observed; written by the operator only.",
    )
