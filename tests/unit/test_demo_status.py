"""`make demo-status` must not show the healthy "look around" text when part of the demo is down."""

import os
import subprocess
import sys

from stalledpolicy.devenv import demo


def _dead_process(name: str) -> demo.Proc:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    proc = demo.Proc.of(name, child.pid, log=f"/tmp/{name}.log")
    child.kill()
    child.wait()
    return proc


def _state(tmp_path, processes) -> None:
    demo.DemoState(dir=tmp_path, plane_dir=str(tmp_path / "plane"), bin_dir="/nonexistent",
                   kubeconfig="/nonexistent", redis_url="redis://127.0.0.1:1/0",
                   processes=processes).save()


def test_a_dead_operator_is_named_and_the_footer_withheld(tmp_path, monkeypatch, capsys):
    _state(tmp_path, {"redis": demo.Proc.of("redis", os.getpid(), log="/tmp/redis.log"),
                      "operator": _dead_process("operator")})
    monkeypatch.setattr(demo, "_plane_running", lambda state: True)
    shown = []
    monkeypatch.setattr(demo, "show", lambda state: shown.append(state))
    monkeypatch.setattr(demo, "footer", lambda state: "Look around: everything fine")

    assert demo.status(tmp_path) == 1
    out = capsys.readouterr().out
    assert shown, "the statuses are still shown: they help finding out why"
    assert "The demo is broken: operator not running" in out
    assert "make demo-down && make demo" in out
    assert "Look around" not in out


def test_a_stopped_control_plane_is_named(tmp_path, capsys):
    _state(tmp_path, {"redis": demo.Proc.of("redis", os.getpid(), log="/tmp/redis.log")})
    assert demo.status(tmp_path) == 1
    out = capsys.readouterr().out
    assert "control plane  NOT running" in out
    assert "The demo is broken: control plane not running" in out


def test_a_running_demo_prints_the_footer(tmp_path, monkeypatch, capsys):
    _state(tmp_path, {"redis": demo.Proc.of("redis", os.getpid(), log="/tmp/redis.log")})
    monkeypatch.setattr(demo, "_plane_running", lambda state: True)
    monkeypatch.setattr(demo, "show", lambda state: None)
    monkeypatch.setattr(demo, "footer", lambda state: "Look around: everything fine")
    assert demo.status(tmp_path) == 0
    out = capsys.readouterr().out
    assert "Look around" in out and "broken" not in out


def test_the_footer_runs_as_printed_again_and_tells_the_workload_only_after_it(tmp_path, monkeypatch):
    """A first-time user's walk through the demo (helper's reproduction): the replay
    line failed the second time (no --overwrite), `stalledpolicy` named by the events
    was not on the exported PATH, and the workload's story was told again by
    `make demo-status` after an edit had changed the budget it names."""
    _state(tmp_path, {})
    state = demo.DemoState.load(tmp_path)
    monkeypatch.setattr(demo, "sweeper_metrics_urls", lambda state: {"emails": "http://127.0.0.1:5/metrics"})
    after_up, later = demo.footer(state, workload_ran=True), demo.footer(state)
    assert "maxStalled 3" in after_up and "maxStalled 3" not in later
    for text in (after_up, later):
        [replay] = [line for line in text.splitlines() if "queues.emq.dev/replay=" in line]
        assert "annotate --overwrite" in replay
        [path] = [line for line in text.splitlines() if line.strip().startswith("export PATH=")]
        assert os.path.dirname(sys.executable) in path.split("=", 1)[1].split(":")
        assert "  stalledpolicy morgue list --redis-url" in text
        assert "make demo-status prints the current ones" in text
