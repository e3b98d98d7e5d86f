"""The one loader of our Lua scripts (package data in ``stalledpolicy/scripts``).

The sweeper, the morgue CLI, the operator and the tests all call scripts
through :func:`script`. Calls go by EVALSHA; on NOSCRIPT (a restarted or
failed-over server, a fresh cluster node) the body is sent once with EVAL,
which also caches it on that server.

Redis runs each EVAL body on its own, so code shared by several scripts is
spliced in when a script is loaded: a line ``-- @include lanes`` is replaced
by the body of ``lib/lanes.lua`` next to the scripts. The body sent, its sha
and :func:`scripts_digest` are all of the expanded text, so a change to a
library rolls the sweepers like a change to a script. Libraries include
nothing themselves (one level keeps the expansion obvious) and are not
scripts: :func:`script_names` does not list them.

A script that only reads says so on its first line with Redis 7's shebang,
``#!lua flags=no-writes``, and is called with EVALSHA_RO / EVAL_RO: a Redis
user with read-only key permissions (``%R~emq:{q}:*``) may run it (Redis
checks EVALSHA's keys as written to), and so may a read-only replica. Redis
before 7 (the README names 6.2 as the oldest supported) knows neither the
shebang nor EVALSHA_RO: when the server says the command is unknown, the same
script is sent without its shebang line (a blank line instead, so line numbers
in errors stay right) by EVALSHA / EVAL. A user whose ACL grants EVALSHA but
not EVALSHA_RO / EVAL_RO (``+evalsha -evalsha_ro``, as grants written before we
used them read) gets the same script, shebang kept, by EVALSHA / EVAL, which
works against a primary. Either fallback is decided once per client (the
client's first read-only call) and remembered for it, so later calls pay no
refused EVALSHA_RO first.

redis-py's RedisCluster routes EVAL/EVALSHA by their keys itself, but any
other command through its command table and ``COMMAND GETKEYS`` (a round trip
per call on Redis 7; a client-side ``RedisError`` on Redis 6.2, whose table has
no EVALSHA_RO): the read-only commands are sent straight to the node of the
first key's slot (``target_nodes``), MOVED and ASK still followed by redis-py.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import (
    ClusterDownError,
    ConnectionError,
    NoScriptError,
    RedisError,
    SlotNotCoveredError,
    TimeoutError,
)

_PACKAGE = "stalledpolicy.scripts"
LIBRARY_FOLDER = "lib"

# The whole line is the directive; any other line starting "-- @include" is a typo.
_INCLUDE = re.compile(r"--\s*@include\b(.*)")
_LIBRARY_NAME = re.compile(r"[a-z][a-z0-9_]*")
# Redis 7's script shebang; its flags are comma-separated
_SHEBANG = re.compile(r"#!lua(?:[ \t]+flags=([a-z0-9_,-]*))?[ \t]*")


class ScriptIncludeError(ValueError):
    """A script's ``-- @include`` line cannot be expanded."""


#: how a read-only script is sent to a client whose server refused EVALSHA_RO
_LEGACY = "legacy"  # Redis before 7: EVALSHA with the body without its shebang
_PLAIN = "plain"    # the ACL refuses EVALSHA_RO / EVAL_RO: EVALSHA with the body as is
# client -> _LEGACY or _PLAIN, once its first read-only call was refused
_READ_ONLY_FALLBACK: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_RO_COMMAND_REFUSED = re.compile(r"no permissions to run the '(?:evalsha_ro|eval_ro)' command")


def _read_only_refused(exc: RedisError) -> str | None:
    """The fallback for ``exc``, raised by EVALSHA_RO / EVAL_RO, or None (not a
    refusal of the command itself: raise it)."""
    if isinstance(exc, NoScriptError):
        return None
    text = str(exc).lower()
    # Redis before 7 has no such command
    if text.startswith("unknown command") and "_ro" in text:
        return _LEGACY
    # redis-py's RedisCluster asks its command table (from COMMAND) before sending
    # anything it does not route itself: Redis 6.2's has no EVALSHA_RO
    if type(exc) is RedisError and "_ro command doesn't exist" in text:
        return _LEGACY
    # the user's ACL grants EVALSHA but not EVALSHA_RO / EVAL_RO (Redis 7)
    if _RO_COMMAND_REFUSED.search(text):
        return _PLAIN
    return None


def _fallback_of(client: Any) -> str | None:
    try:
        return _READ_ONLY_FALLBACK.get(client)
    except TypeError:  # a client that cannot be weakly referenced: nothing remembered
        return None


def _remember(client: Any, fallback: str) -> None:
    try:
        _READ_ONLY_FALLBACK[client] = fallback
    except TypeError:
        pass


# what RedisCluster retries itself, when it picks the node
_CLUSTER_RETRY = (ConnectionError, TimeoutError, ClusterDownError, SlotNotCoveredError)


def _read_only_call(client: Any, command: str, sha_or_body: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """EVALSHA_RO / EVAL_RO; on a RedisCluster sent to the node of the keys' slot
    (all of a queue's keys share it), without the command table or COMMAND GETKEYS."""
    if not (keys and isinstance(client, RedisCluster)):
        return getattr(client, command)(sha_or_body, len(keys), *keys, *args)
    # target_nodes turns off RedisCluster's retries after a node was lost: redo them
    attempts = 1 + max(0, client.retry.get_retries())
    for attempt in range(attempts):
        try:
            node = client.get_node_from_key(keys[0])
            return client.execute_command(command.upper(), sha_or_body, len(keys), *keys, *args, target_nodes=node)
        except _CLUSTER_RETRY as exc:
            if attempt + 1 == attempts:
                raise
            # ConnectionError and TimeoutError already refreshed the slot table
            if not isinstance(exc, (ConnectionError, TimeoutError)):
                client.nodes_manager.initialize()
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class LuaScript:
    name: str
    body: str
    sha: str
    #: declared ``#!lua flags=no-writes``: called with EVALSHA_RO / EVAL_RO
    read_only: bool = False
    #: ``body`` without its shebang line, for Redis before 7 (``body`` itself when it has none)
    legacy_body: str = ""

    def __call__(self, client: Any, keys: Sequence[str], args: Sequence[Any] = ()) -> Any:
        if not self.read_only:
            return self._call(client, self.body, keys, args, self.sha)
        fallback = _fallback_of(client)
        if fallback is None:
            try:
                try:
                    return _read_only_call(client, "evalsha_ro", self.sha, keys, args)
                except NoScriptError:
                    return _read_only_call(client, "eval_ro", self.body, keys, args)
            except RedisError as exc:
                fallback = _read_only_refused(exc)
                if fallback is None:
                    raise
            _remember(client, fallback)
        if fallback == _LEGACY:
            # Redis < 7: no EVALSHA_RO and no shebang (nor read-only key permissions)
            return self._call(client, self.legacy_body, keys, args)
        return self._call(client, self.body, keys, args, self.sha)

    @staticmethod
    def _call(client: Any, body: str, keys: Sequence[str], args: Sequence[Any], sha: str | None = None) -> Any:
        try:
            return client.evalsha(sha or _sha(body), len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(body, len(keys), *keys, *args)


def _sha(body: str) -> str:
    return hashlib.sha1(body.encode("utf-8")).hexdigest()


def _shebang_flags(script_file: str, body: str, package: str) -> tuple[bool, str]:
    """Whether ``body``'s shebang declares ``no-writes``, and the body for Redis
    before 7 (the shebang line blanked)."""
    first, newline, rest = body.partition("\n")
    if not first.startswith("#!"):
        return False, body
    match = _SHEBANG.fullmatch(first)
    if match is None:
        raise ScriptIncludeError(f"{package}: {script_file} line 1: {first!r} is not a shebang Redis reads; "
                                 "write '#!lua' or '#!lua flags=no-writes'")
    flags = (match.group(1) or "").split(",")
    return "no-writes" in flags, newline + rest


def script_names(package: str = _PACKAGE) -> list[str]:
    """The scripts of ``package`` (library files live in a sub-folder: not listed)."""
    return sorted(
        entry.name[: -len(".lua")]
        for entry in resources.files(package).iterdir()
        if entry.is_file() and entry.name.endswith(".lua")
    )


def _included(script_file: str, line_no: int, rest: str, package: str, seen: set[str]) -> str:
    where = f"{package}: {script_file} line {line_no}"
    name = rest.strip()
    if not _LIBRARY_NAME.fullmatch(name):
        raise ScriptIncludeError(
            f"{where}: '-- @include {name}' is not a library name; write '-- @include <name>' "
            f"for {LIBRARY_FOLDER}/<name>.lua (lower-case letters, digits, _)"
        )
    if name in seen:
        raise ScriptIncludeError(f"{where}: library {name!r} is included twice; keep one '-- @include {name}'")
    seen.add(name)
    library_file = f"{LIBRARY_FOLDER}/{name}.lua"
    source = resources.files(package).joinpath(LIBRARY_FOLDER, f"{name}.lua")
    if not source.is_file():
        raise ScriptIncludeError(f"{where}: '-- @include {name}' names no library: {library_file} does not exist")
    body = source.read_text(encoding="utf-8")
    for nested in body.splitlines():
        if _INCLUDE.fullmatch(nested.strip()):
            raise ScriptIncludeError(
                f"{package}: {library_file} (included by {script_file}) has an '-- @include' line; "
                "libraries include nothing: include both from the script"
            )
    if not body.endswith("\n"):
        body += "\n"
    # the markers let a Lua error's line number be traced back to its file
    return f"-- >>> {library_file}\n{body}-- <<< {library_file}\n"


def expand(script_file: str, text: str, package: str = _PACKAGE) -> str:
    """``text`` with each ``-- @include <name>`` line replaced by ``lib/<name>.lua``."""
    seen: set[str] = set()
    out = []
    for line_no, line in enumerate(text.splitlines(keepends=True), start=1):
        directive = _INCLUDE.fullmatch(line.strip())
        out.append(_included(script_file, line_no, directive.group(1), package, seen) if directive else line)
    return "".join(out)


@cache
def script(name: str, package: str = _PACKAGE) -> LuaScript:
    """``package`` defaults to our product scripts; the devenv's EchoMQ-shaped
    worker keeps its own (a model of programs we do not own) in its own folder."""
    script_file = f"{name}.lua"
    body = expand(script_file, resources.files(package).joinpath(script_file).read_text(encoding="utf-8"), package)
    read_only, legacy_body = _shebang_flags(script_file, body, package)
    return LuaScript(name=name, body=body, sha=_sha(body), read_only=read_only, legacy_body=legacy_body)


def scripts_digest(package: str = _PACKAGE) -> str:
    """One hash over every expanded script body: part of the sweeper's rollout hash."""
    digest = hashlib.sha256()
    for name in script_names(package):
        digest.update(name.encode() + b"\0" + script(name, package).body.encode() + b"\0")
    return digest.hexdigest()
