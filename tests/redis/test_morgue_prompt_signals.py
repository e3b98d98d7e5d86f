"""Ctrl-C at the confirmation prompt is an interruption (130), as everywhere
else in the command (SIGTERM there is 143), not an answer (4 is "declined":
any answer but y/yes, or end of input). A script checking $? after an
operator's Ctrl-C sees 130. Nothing is changed either way. That holds whatever
disposition the command inherited: a background job of a non-interactive
shell starts with SIGINT ignored, and the prompt still honours Ctrl-C."""

from __future__ import annotations

import io
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

from stalledpolicy.morgue import cli as morgue_cli
from tests.redis.test_morgue_cli import _args, dump, standard_morgue

pytestmark = pytest.mark.redis


class CtrlCAtThePrompt:
    """A terminal on which the operator presses Ctrl-C instead of answering."""

    def isatty(self) -> bool:
        return True

    def readline(self) -> str:
        raise KeyboardInterrupt


@pytest.mark.parametrize("action", [["replay", "--all"], ["purge", "--all"], ["purge", "--older-than", "1m"]])
def test_ctrl_c_at_the_prompt_exits_130_and_changes_nothing(r, redis_server, queue_name, action):
    standard_morgue(r, queue_name)
    before = dump(r)
    out, err = io.StringIO(), io.StringIO()
    code = morgue_cli.run(_args(*action, "--redis-url", redis_server.url, "--queue", queue_name),
                          stdin=CtrlCAtThePrompt(), stdout=out, stderr=err)
    assert code == 130, err.getvalue()
    assert "[y/N] \n" in err.getvalue()  # the next line starts on its own line
    assert f"stalledpolicy morgue {action[0]}: interrupted\nnothing was changed\n" in err.getvalue()
    assert "aborted" not in err.getvalue() and out.getvalue() == ""
    assert dump(r) == before


def test_ctrl_c_at_the_prompt_is_honoured_when_sigint_was_inherited_ignored(r, redis_server, queue_name):
    """In process: the command installs its own SIGINT handler while it runs
    (an inherited SIG_IGN would swallow Ctrl-C at the prompt, which then waits
    forever) and gives the caller's disposition back when it returns."""
    standard_morgue(r, queue_name)
    before = dump(r)

    class CtrlCOnTheTerminal:
        def isatty(self) -> bool:
            return True

        def readline(self) -> str:
            os.kill(os.getpid(), signal.SIGINT)  # ignored, the read would go on: "" declines here
            return ""

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        out, err = io.StringIO(), io.StringIO()
        code = morgue_cli.run(_args("purge", "--all", "--redis-url", redis_server.url, "--queue", queue_name),
                              stdin=CtrlCOnTheTerminal(), stdout=out, stderr=err)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 130, err.getvalue()
    assert "stalledpolicy morgue purge: interrupted\nnothing was changed\n" in err.getvalue()
    assert dump(r) == before


def _inheriting(signum: int, disposition: signal.Handlers):
    """The child's disposition of ``signum`` is set here, not inherited from
    however pytest was started (a background job gets SIGINT ignored)."""
    return lambda: signal.signal(signum, disposition)


@pytest.mark.parametrize("inherited", [signal.SIG_DFL, signal.SIG_IGN], ids=["inherited-default", "inherited-ignored"])
@pytest.mark.parametrize(("signum", "code", "words"), [(signal.SIGINT, 130, "interrupted"),
                                                       (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_a_signal_at_a_real_prompt_exits_128_plus_its_number(r, redis_server, queue_name, signum, code, words,
                                                             inherited):
    standard_morgue(r, queue_name)
    before = dump(r)
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLEDPOLICY_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stalledpolicy", "morgue", "purge", "--all", "--queue", queue_name,
         "--redis-url", redis_server.url],
        stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        preexec_fn=_inheriting(signum, inherited))
    os.close(slave)
    try:
        shown = b""
        deadline = time.monotonic() + 60  # a bound on the wait, not a timing assert
        while b"[y/N] " not in shown:
            assert time.monotonic() < deadline and proc.poll() is None, shown
            if select.select([proc.stderr], [], [], 0.5)[0]:
                shown += os.read(proc.stderr.fileno(), 4096)
        proc.send_signal(signum)  # as the terminal's Ctrl-C, or a kill, does
        rest_out, rest_err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a prompt that ignored the signal is not left behind
            proc.kill()
            proc.communicate()
        os.close(master)
    err = (shown + rest_err).decode()
    assert proc.returncode == code, err
    assert f"{words}\nnothing was changed\n" in err and "aborted" not in err
    assert rest_out == b""
    assert dump(r) == before


def test_the_help_says_where_130_and_4_come_from():
    text = subprocess.run([sys.executable, "-m", "stalledpolicy", "morgue", "purge", "--help"],
                          capture_output=True, text=True, timeout=60).stdout
    flat = " ".join(text.split())
    assert "4 aborted: the confirmation prompt got an answer other than y or yes, or end of input (Ctrl-D); " \
           "nothing changed" in flat
    assert "130 interrupted (Ctrl-C, SIGINT), at the confirmation prompt too" in flat
    assert "143 terminated (SIGTERM), at the confirmation prompt too" in flat
