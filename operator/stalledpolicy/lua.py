"""The one loader of our Lua scripts (package data in ``stalledpolicy/scripts``).

The sweeper, the morgue CLI, the operator and the tests all call scripts
through :func:`script`. Calls go by EVALSHA; on NOSCRIPT (a restarted or
failed-over server, a fresh cluster node) the body is sent once with EVAL,
which also caches it on that server.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Sequence

from redis.exceptions import NoScriptError

_PACKAGE = "stalledpolicy.scripts"


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
    return sorted(
        entry.name[: -len(".lua")]
        for entry in resources.files(package).iterdir()
        if entry.name.endswith(".lua")
    )


@cache
def script(name: str, package: str = _PACKAGE) -> LuaScript:
    """``package`` defaults to our product scripts; the devenv's EchoMQ-shaped
    worker keeps its own (a model of programs we do not own) in its own folder."""
    body = resources.files(package).joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return LuaScript(name=name, body=body, sha=hashlib.sha1(body.encode("utf-8")).hexdigest())


def scripts_digest() -> str:
    """One hash over every script body: part of the sweeper's rollout hash."""
    digest = hashlib.sha256()
    for name in script_names():
        digest.update(name.encode() + b"\0" + script(name).body.encode() + b"\0")
    return digest.hexdigest()
