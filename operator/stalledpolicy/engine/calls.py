"""How the engine calls our scripts and reads their replies: reply values as
text and counters, argument checks, and ACL refusals turned into ``EMQNOPERM``
messages that name the grant (Redis's own words name neither)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from typing import Any

from redis import Redis
from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

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


def _raise_refusal(exc: ResponseError, keys: QueueKeys, read_only: bool) -> None:
    """Raise ``exc`` as :class:`AclRefused` when it is the ACL refusing a script call; else return."""
    refusal = None if str(exc).startswith("EMQNOPERM") else _acl_refusal(exc, keys.prefix, read_only)
    if refusal is not None:
        raise AclRefused(refusal) from exc


def run_script(name: str, client: Any, keys: QueueKeys, key_names: Sequence[str], args: Sequence[Any]) -> Any:
    """Call script ``name``; an ACL refusal of its keys or commands is raised as
    :class:`AclRefused`, naming the grant (Redis's own words name neither)."""
    loaded = script(name)
    try:
        return loaded(client, key_names, args)
    except ResponseError as exc:
        _raise_refusal(exc, keys, loaded.read_only)
        raise


class ScriptCalls:
    """Calls of one writing script, one at a time, each sent (:meth:`send`) and
    its reply read (:meth:`receive`) apart: between the two the caller does its
    bookkeeping of the call before, while Redis runs this one. The reply and
    its errors are :func:`run_script`'s. Through any client the call is made
    when its reply is read; :func:`script_calls` picks :class:`HeldConnection`
    where the client allows it. :meth:`close` when done. ``sent_at``
    (``time.perf_counter()``): when the call whose reply comes next went out."""

    def __init__(self, name: str, client: Any, keys: QueueKeys, key_names: Sequence[str]) -> None:
        self.name, self.client, self.keys, self.key_names = name, client, keys, list(key_names)
        self._args: Sequence[Any] = ()
        self.sent_at = 0.0

    def send(self, args: Sequence[Any]) -> None:
        self._args = args

    def receive(self) -> Any:
        self.sent_at = time.perf_counter()
        return run_script(self.name, self.client, self.keys, self.key_names, self._args)

    def close(self) -> None:
        pass


class HeldConnection(ScriptCalls):
    """:class:`ScriptCalls` on one pooled connection of a single server's plain
    client, held until :meth:`close`: :meth:`send` writes the call at once
    (docs/architecture.md, "The next call before the last one's bookkeeping").
    One attempt per call, as that client makes. NOSCRIPT (the server's script
    cache was emptied) makes that call again through the client, whose EVAL
    caches the body. Any failure but an error reply drops the connection: a
    reply may still be on its way, and no later call may take it for its own."""

    def __init__(self, name: str, client: Any, keys: QueueKeys, key_names: Sequence[str]) -> None:
        super().__init__(name, client, keys, key_names)
        self._script = script(name)
        self._pool = client.connection_pool
        self._connection: Any = self._pool.get_connection()

    def send(self, args: Sequence[Any]) -> None:
        self._args = args
        try:
            self._connection.send_command("EVALSHA", self._script.sha, len(self.key_names), *self.key_names, *args)
        except BaseException:
            self._connection.disconnect()
            raise
        self.sent_at = time.perf_counter()

    def receive(self) -> Any:
        try:
            return self._connection.read_response()
        except NoScriptError:
            # (the call did not run) sent again through the client, timed from there
            return super().receive()
        except ResponseError as exc:
            _raise_refusal(exc, self.keys, read_only=False)
            raise
        except BaseException:
            self._connection.disconnect()
            raise

    def close(self) -> None:
        self._pool.release(self._connection)


def script_calls(name: str, client: Any, keys: QueueKeys, key_names: Sequence[str]) -> ScriptCalls:
    """:class:`HeldConnection` for a plain ``redis.Redis`` (exactly that class:
    a subclass may change how its commands are sent) with a pool of its own
    connections, else :class:`ScriptCalls` (a Redis Cluster's client routes each
    call to the node of its keys, and retries)."""
    if type(client) is Redis and client.connection is None and not script(name).read_only:
        return HeldConnection(name, client, keys, key_names)
    return ScriptCalls(name, client, keys, key_names)
