"""Scripts declared ``#!lua flags=no-writes`` are called read-only (EVALSHA_RO),
and fall back to EVALSHA without the shebang on Redis before 7."""

from __future__ import annotations

import hashlib

import pytest
from redis.exceptions import NoScriptError, ResponseError

from stalledpolicy import lua


class FakeClient:
    """Records calls; ``redis6``: EVALSHA_RO / EVAL_RO are unknown commands."""

    def __init__(self, *, redis6: bool = False) -> None:
        self.redis6 = redis6
        self.cached: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    def _run(self, command: str, sha_or_body: str, body: bool) -> str:
        self.calls.append((command, sha_or_body))
        if self.redis6 and command.endswith("_ro"):
            raise ResponseError(f"unknown command '{command.upper()}', with args beginning with: ")
        if body:
            if self.redis6 and sha_or_body.startswith("#!"):
                raise ResponseError("Error compiling script (new function): user_script:1: unexpected symbol")
            self.cached.add(hashlib.sha1(sha_or_body.encode()).hexdigest())
            return "ran"
        if sha_or_body not in self.cached:
            raise NoScriptError("No matching script. Please use EVAL.")
        return "ran"

    def evalsha_ro(self, sha, numkeys, *rest):
        return self._run("evalsha_ro", sha, False)

    def eval_ro(self, body, numkeys, *rest):
        return self._run("eval_ro", body, True)

    def evalsha(self, sha, numkeys, *rest):
        return self._run("evalsha", sha, False)

    def eval(self, body, numkeys, *rest):
        return self._run("eval", body, True)


def test_the_morgue_scan_is_declared_read_only_and_the_writers_are_not():
    assert lua.script("morgue_scan").read_only
    assert lua.script("morgue_scan").body.startswith("#!lua flags=no-writes\n")
    for name in ("sweep", "morgue_replay", "morgue_purge"):
        assert not lua.script(name).read_only, name


def test_a_read_only_script_is_called_read_only_on_redis_7():
    client = FakeClient()
    scan = lua.script("morgue_scan")
    assert scan(client, ["k"]) == "ran" and scan(client, ["k"]) == "ran"
    assert [c for c, _ in client.calls] == ["evalsha_ro", "eval_ro", "evalsha_ro"]


def test_before_redis_7_the_same_script_runs_without_its_shebang():
    client = FakeClient(redis6=True)
    scan = lua.script("morgue_scan")
    assert scan(client, ["k"]) == "ran"
    sent = [body for command, body in client.calls if command == "eval"]
    assert sent == [scan.legacy_body]
    assert not scan.legacy_body.startswith("#!")
    # the shebang line is blanked, so a Lua error's line number is the file's
    assert scan.legacy_body.count("\n") == scan.body.count("\n")
    assert scan.legacy_body.splitlines()[1:] == scan.body.splitlines()[1:]


def test_a_shebang_redis_cannot_read_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "luashebang"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "s.lua").write_text("#!lua flags = no-writes\nreturn 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(lua.ScriptIncludeError, match="not a shebang Redis reads"):
        lua.script("s", "luashebang")
