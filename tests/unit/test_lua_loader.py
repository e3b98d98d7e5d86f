"""The Lua loader's include mechanism: ``-- @include <name>`` splices ``lib/<name>.lua``."""

from __future__ import annotations

import hashlib
import re
import uuid
from importlib import resources
from pathlib import Path

import pytest

from stalledpolicy import lua

LANES_LIB = "local function lane_ring()\n  return 'lanes v1'\nend\n"


@pytest.fixture
def make_package(tmp_path, monkeypatch):
    """A throwaway importable package of scripts: ``files`` maps relative paths to text."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(files: dict[str, str]) -> tuple[str, Path]:
        name = f"luatest_{uuid.uuid4().hex}"
        root = tmp_path / name
        root.mkdir()
        (root / "__init__.py").write_text("")
        for relative, text in files.items():
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return name, root

    return make


def test_an_include_line_is_replaced_by_the_library_body(make_package):
    package, _ = make_package({
        "wake.lua": "-- header\n-- @include lanes\nlocal r = lane_ring()\nreturn r\n",
        "lib/lanes.lua": LANES_LIB,
    })
    body = lua.script("wake", package).body
    assert "@include" not in body
    assert body.startswith("-- header\n")
    assert body.endswith("local r = lane_ring()\nreturn r\n")
    # the library sits exactly where the directive was, before its first use
    assert body.index("local function lane_ring()") < body.index("local r = lane_ring()")
    assert LANES_LIB in body
    assert body.count("lib/lanes.lua") == 2  # begin and end markers name the file


def test_the_sha_is_of_the_expanded_body(make_package):
    package, _ = make_package({"wake.lua": "-- @include lanes\nreturn 1\n", "lib/lanes.lua": LANES_LIB})
    loaded = lua.script("wake", package)
    assert loaded.sha == hashlib.sha1(loaded.body.encode()).hexdigest()
    raw = "-- @include lanes\nreturn 1\n"
    assert loaded.sha != hashlib.sha1(raw.encode()).hexdigest()


def test_library_files_are_not_scripts(make_package):
    package, _ = make_package({
        "wake.lua": "-- @include lanes\nreturn 1\n",
        "plain.lua": "return 2\n",
        "lib/lanes.lua": LANES_LIB,
    })
    assert lua.script_names(package) == ["plain", "wake"]


def test_the_digest_changes_when_only_a_library_changes(make_package):
    package, root = make_package({"wake.lua": "-- @include lanes\nreturn 1\n", "lib/lanes.lua": LANES_LIB})
    before = lua.scripts_digest(package)
    (root / "lib" / "lanes.lua").write_text(LANES_LIB.replace("v1", "v2"))
    lua.script.cache_clear()  # a new image is a new process: nothing cached
    assert lua.scripts_digest(package) != before
    assert "lanes v2" in lua.script("wake", package).body


def test_an_unknown_include_names_the_script_and_the_include(make_package):
    package, _ = make_package({"sweepish.lua": "local a = 1\n-- @include no_such_lib\nreturn a\n"})
    with pytest.raises(lua.ScriptIncludeError) as info:
        lua.script("sweepish", package)
    message = str(info.value)
    assert "sweepish.lua line 2" in message
    assert "no_such_lib" in message and "lib/no_such_lib.lua does not exist" in message


@pytest.mark.parametrize(
    "directive, problem",
    [
        ("-- @include", "is not a library name"),
        ("-- @include lanes.lua", "is not a library name"),
        ("--@include ../secrets", "is not a library name"),
        ("-- @include lanes\n-- @include lanes", "included twice"),
    ],
)
def test_a_malformed_include_is_refused(make_package, directive, problem):
    package, _ = make_package({"s.lua": f"{directive}\nreturn 1\n", "lib/lanes.lua": LANES_LIB})
    with pytest.raises(lua.ScriptIncludeError, match=re.escape(problem)) as info:
        lua.script("s", package)
    assert "s.lua line" in str(info.value)


def test_a_library_cannot_include_another(make_package):
    package, _ = make_package({
        "s.lua": "-- @include outer\nreturn 1\n",
        "lib/outer.lua": "-- @include lanes\n",
        "lib/lanes.lua": LANES_LIB,
    })
    with pytest.raises(lua.ScriptIncludeError, match=r"lib/outer\.lua \(included by s\.lua\)"):
        lua.script("s", package)


def test_a_script_without_includes_is_loaded_byte_for_byte(make_package):
    text = "-- no includes here, only a mention of @include in prose\nreturn 'x'\n"
    package, _ = make_package({"s.lua": text})
    assert lua.script("s", package).body == text


def test_product_scripts_are_fully_expanded_and_every_library_is_used():
    libraries = {
        entry.name[: -len(".lua")]
        for entry in resources.files("stalledpolicy.scripts").joinpath(lua.LIBRARY_FOLDER).iterdir()
        if entry.name.endswith(".lua")
    }
    assert libraries, "the product scripts share no library"
    used = set()
    for name in lua.script_names():
        loaded = lua.script(name)
        assert "@include" not in loaded.body, name
        assert loaded.sha == hashlib.sha1(loaded.body.encode()).hexdigest()
        used |= set(re.findall(r"-- >>> lib/(\w+)\.lua", loaded.body))
    assert used == libraries
    assert not libraries & set(lua.script_names())
