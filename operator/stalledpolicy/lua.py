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
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Sequence

from redis.exceptions import NoScriptError

_PACKAGE = "stalledpolicy.scripts"
LIBRARY_FOLDER = "lib"

# The whole line is the directive; any other line starting "-- @include" is a typo.
_INCLUDE = re.compile(r"--\s*@include\b(.*)")
_LIBRARY_NAME = re.compile(r"[a-z][a-z0-9_]*")


class ScriptIncludeError(ValueError):
    """A script's ``-- @include`` line cannot be expanded."""


@dataclass(frozen=True)
class LuaScript:
    name: str
    body: str
    sha: str

    def __call__(self, client: Any, keys: Sequence[str], args: Sequence[Any] = ()) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(self.body, len(keys), *keys, *args)


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
    return LuaScript(name=name, body=body, sha=hashlib.sha1(body.encode("utf-8")).hexdigest())


def scripts_digest(package: str = _PACKAGE) -> str:
    """One hash over every expanded script body: part of the sweeper's rollout hash."""
    digest = hashlib.sha256()
    for name in script_names(package):
        digest.update(name.encode() + b"\0" + script(name, package).body.encode() + b"\0")
    return digest.hexdigest()
