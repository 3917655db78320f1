"""A detached run (flows/caller.py): ``nohup python -m flows.stage … &`` used to be stopped when the shell that
started it exited ("its caller bash exited"); with ``OTFED_DETACHED=1`` a stage answers to nobody and runs on.
Without it, a stage still stops when its caller is gone (the control case, and what a killed ``dvc`` needs).
"""
from __future__ import annotations

import subprocess
import sys
import threading

import psutil
import pytest

from flows import caller
from tests.ceilings import ceiling, wait_until
from tests.integration.support import REPO, clean_env

GONE = caller.Process(psutil.Process().pid, 1.0, "bash")  # this pid, another start time: a caller long gone


def _lifelines() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "otfed-lifeline"]


@pytest.mark.parametrize("raw, detached", [(None, False), ("", False), ("0", False), ("1", True), ("yes", True)])
def test_the_setting(raw: str | None, detached: bool) -> None:
    assert caller.detached({} if raw is None else {"OTFED_DETACHED": raw}) is detached


def test_a_detached_stage_answers_to_nobody(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(caller, "caller", lambda pid=None: GONE)  # the shell that started it has exited
    monkeypatch.setenv("OTFED_DETACHED", "1")
    before = len(_lifelines())
    lifeline = caller.Lifeline().start()
    try:
        assert lifeline.process is None
        assert len(_lifelines()) == before  # nothing watched: no SIGTERM can come
        lifeline.check()  # outputs may be swapped in
    finally:
        lifeline.stop()


def test_without_the_setting_a_stage_whose_caller_is_gone_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(caller, "caller", lambda pid=None: GONE)
    monkeypatch.delenv("OTFED_DETACHED", raising=False)
    lifeline = caller.Lifeline()
    assert lifeline.process == GONE
    with pytest.raises(caller.CallerGone, match=r"the process that started this stage \(bash, pid \d+\) has exited"):
        lifeline.check()


# a stand-in stage: takes its lifeline while the shell that started it runs, says so, waits until that shell has
# exited (it is then reparented), and says whether its outputs could still be swapped in
STAGE = """
import os, sys, time
import psutil
from flows.caller import CallerGone, Lifeline
shell = psutil.Process(os.getppid())
lifeline = Lifeline()
print("armed", "none" if lifeline.process is None else lifeline.process.name, flush=True)
shell.wait()
try:
    lifeline.check()
    print("outputs swapped in", flush=True)
except CallerGone as exc:
    print("refused:", exc, flush=True)
"""


@pytest.mark.integration
@pytest.mark.parametrize("detached", [True, False])
def test_a_nohup_run_outlives_its_shell_only_when_detached(tmp_path, detached: bool) -> None:
    """``bash -c 'nohup python … &'``: bash exits as soon as the stage is in the background (after the stage
    has taken its lifeline: bash waits for its first line). A second background job of bash's (``sleep``,
    stopped before bash exits) makes bash the stage's caller, as an interactive shell with other jobs is — a
    shell with one child only stands in between (``caller``) and its own parent, pytest, would be answered to."""
    out = tmp_path / "stage.out"
    script = tmp_path / "stage.py"
    script.write_text(STAGE)
    setting = "OTFED_DETACHED=1 " if detached else ""
    shell = (f"sleep 600 & other=$!; {setting}nohup {sys.executable} {script} > {out} 2>&1 & "
             f"while ! grep -q armed {out} 2>/dev/null; do sleep 0.05; done; kill $other")
    subprocess.run(["bash", "-c", shell], cwd=REPO, env=clean_env(), check=True, timeout=ceiling(120))
    lines = _await_last_line(out)
    assert lines[0] == ("armed none" if detached else "armed bash")
    if detached:
        assert lines[-1] == "outputs swapped in"
    else:
        assert lines[-1].startswith("refused: the process that started this stage (bash, pid ")


def _await_last_line(out) -> list[str]:
    wait_until(lambda: len(out.read_text().splitlines()) >= 2, "the stand-in stage's verdict", 120, poll=0.05)
    return out.read_text().splitlines()
