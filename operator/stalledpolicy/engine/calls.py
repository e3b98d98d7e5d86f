"""How the engine calls our scripts and reads their replies: reply values as
text and counters, argument checks, and ACL refusals turned into ``EMQNOPERM``
messages that name the grant (Redis's own words name neither)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from redis.exceptions import NoPermissionError, ResponseError

from stalledpolicy.keyspace import QueueKeys
from stalledpolicy.lua import script


def as_text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


# a counter as the scripts read one (lib/counters.lua): what HINCRBY writes,
# at most 15 digits; Python's int() would also take " 12", "1_0" or "١٢"
_COUNTER = re.compile(r"0|[1-9][0-9]{0,14}")


def as_counter(value: Any) -> int | None:
    value = as_text(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, str) or not _COUNTER.fullmatch(value):
        return None
    return int(value)


def merged_problems(first: list[str], second: Iterable[str]) -> list[str]:
    """The problems two calls reported, each once, in the order first seen."""
    return list(dict.fromkeys([*first, *second]))


def check_budget(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: budget must be an integer >= 0 (0 = never dead-letter), got {value!r}")
    return value


def check_positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
    return value


class AclRefused(NoPermissionError):
    """The Redis ACL refused a script call of a queue: its keys (the user's key
    patterns leave them out, or allow only reading to a script that writes) or
    a command. The message is ``EMQNOPERM ...`` naming the queue's key pattern
    and the grant that fixes it, as the scripts' own refusals do (lib/refusals)."""


# what the server says when the ACL refuses a key or a command: to EVALSHA's
# own arguments (redis-py strips the NOPERM), or to a command run inside the
# script; Redis's words, then Valkey's (8: "No permissions to access a key",
# "ACL failure in script: User u has no permissions to run the 'hset' command")
_KEY_REFUSALS = ("no permissions to access one of the keys", "can't access at least one of the keys",
                 "no permissions to access a key")
_COMMAND_REFUSAL = re.compile(r"no permissions to run the '([^']+)' command|can't run this command")


def is_acl_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` is the Redis ACL refusing a script call (ours, or Redis's own words)."""
    return isinstance(exc, NoPermissionError) or str(exc).startswith("EMQNOPERM")


def _acl_refusal(exc: ResponseError, prefix: str, read_only: bool) -> str | None:
    text = str(exc).lower()
    grant = f"ACL SETUSER <user> ~{prefix}* &{prefix}events +@all"
    if any(words in text for words in _KEY_REFUSALS):
        if read_only:
            return (f"EMQNOPERM the Redis user may not read the queue's keys {prefix}* (ACL): nothing was read; "
                    f"grant it read access to them at least (e.g. ACL SETUSER <user> %R~{prefix}*), or the "
                    f"queue's keys, channel and commands to also sweep, replay and purge (e.g. {grant})")
        return (f"EMQNOPERM the Redis user may not read and write the queue's keys {prefix}* (ACL): nothing was "
                f"changed; grant it the queue's keys, channel and commands (e.g. {grant}; read-only "
                f"keys, %R~{prefix}*, are not enough: the script writes)")
    command = _COMMAND_REFUSAL.search(text)
    if command is None:
        return None
    what = command.group(1).upper() if command.group(1) else "a command of the script"
    return (f"EMQNOPERM the Redis user may not run {what} (ACL): nothing was changed; grant it the queue's "
            f"keys, channel and commands (e.g. {grant})")


def run_script(name: str, client: Any, keys: QueueKeys, key_names: Sequence[str], args: Sequence[Any]) -> Any:
    """Call script ``name``; an ACL refusal of its keys or commands is raised as
    :class:`AclRefused`, naming the grant (Redis's own words name neither)."""
    loaded = script(name)
    try:
        return loaded(client, key_names, args)
    except ResponseError as exc:
        refusal = None if str(exc).startswith("EMQNOPERM") else _acl_refusal(exc, keys.prefix, loaded.read_only)
        if refusal is None:
            raise
        raise AclRefused(refusal) from exc
