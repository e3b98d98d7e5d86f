"""Scripts declared ``#!lua flags=no-writes`` are called read-only (EVALSHA_RO),
and fall back to EVALSHA without the shebang on Redis before 7."""

from __future__ import annotations

import hashlib

import pytest
from redis.exceptions import NoPermissionError, NoScriptError, RedisError, ResponseError

from stalledpolicy import lua


class FakeClient:
    """Records calls; ``redis6``: EVALSHA_RO / EVAL_RO are unknown commands."""

    def __init__(self, *, redis6: bool = False, refusal: Exception | None = None) -> None:
        self.redis6 = redis6
        #: raised for EVALSHA_RO / EVAL_RO instead of running them
        self.refusal = refusal
        self.cached: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    def _run(self, command: str, sha_or_body: str, body: bool) -> str:
        self.calls.append((command, sha_or_body))
        if self.refusal is not None and command.endswith("_ro"):
            raise self.refusal
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


def test_the_fallback_is_decided_once_per_client():
    """Each call paid a refused EVALSHA_RO first on Redis 6.2."""
    scan = lua.script("morgue_scan")
    client = FakeClient(redis6=True)
    for _ in range(3):
        assert scan(client, ["k"]) == "ran"
    legacy_sha = hashlib.sha1(scan.legacy_body.encode()).hexdigest()
    assert client.calls == [("evalsha_ro", scan.sha), ("evalsha", legacy_sha), ("eval", scan.legacy_body),
                            ("evalsha", legacy_sha), ("evalsha", legacy_sha)]
    # another client (another server) decides for itself
    fresh = FakeClient()
    assert scan(fresh, ["k"]) == "ran" and scan(fresh, ["k"]) == "ran"
    assert [c for c, _ in fresh.calls] == ["evalsha_ro", "eval_ro", "evalsha_ro"]


def test_redis_py_cluster_refusing_evalsha_ro_itself_falls_back():
    """Redis 6.2 is not installed: this fake raises what redis-py's RedisCluster
    raises there before sending anything (its command table, from COMMAND, has
    no EVALSHA_RO): a plain RedisError, not a ResponseError. It was raised."""
    scan = lua.script("morgue_scan")
    client = FakeClient(redis6=True, refusal=RedisError("EVALSHA_RO command doesn't exist in Redis commands"))
    assert scan(client, ["k"]) == "ran" and scan(client, ["k"]) == "ran"
    assert [c for c, _ in client.calls] == ["evalsha_ro", "evalsha", "eval", "evalsha"]
    assert client.calls[2] == ("eval", scan.legacy_body)


def test_an_acl_without_evalsha_ro_gets_evalsha_with_the_script_as_declared():
    """A grant of +evalsha without +evalsha_ro was refused (NOPERM, exit 3)."""
    scan = lua.script("morgue_scan")
    refusal = NoPermissionError("this user has no permissions to run the 'evalsha_ro' command")
    client = FakeClient(refusal=refusal)
    assert scan(client, ["k"]) == "ran" and scan(client, ["k"]) == "ran"
    assert client.calls == [("evalsha_ro", scan.sha), ("evalsha", scan.sha), ("eval", scan.body),
                            ("evalsha", scan.sha)]


@pytest.mark.parametrize("refusal", [
    NoPermissionError("this user has no permissions to access one of the keys used as arguments"),
    ResponseError("BUSY Redis is busy running a script"),
    RedisError("Connection closed by server."),
])
def test_other_refusals_of_evalsha_ro_are_raised_and_not_remembered(refusal):
    scan = lua.script("morgue_scan")
    client = FakeClient(refusal=refusal)
    for _ in range(2):
        with pytest.raises(type(refusal)):
            scan(client, ["k"])
    assert [c for c, _ in client.calls] == ["evalsha_ro", "evalsha_ro"]
