"""A server that cannot start because the disk is full says so (flows/prefect_server.py): with the preflight's
free-space check lowered (``OTFED_MIN_FREE_MB``), a full disk used to read "the server exited before writing
anything" — the keeper could not even write its log. Now the stage's error names ENOSPC, from the log's own words
(``database or disk is full``, ``[Errno 28] No space left on device``) or from the free space left where the
server writes.

No server starts here: the keeper is a stand-in that has already exited, and the free space is what
``shutil.disk_usage`` is made to report. (A real server on a database that cannot grow: tests/flows/
test_prefect_server.py, marked integration.)
"""
from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from flows import prefect_server

SQLITE_FULL = "sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) database or disk is full"


def test_an_empty_log_and_a_full_disk_read_enospc() -> None:
    cause = prefect_server._cause([], Path("/p/.prefect"), 0.2)
    assert cause == ("no space left on device (ENOSPC): the server needs room for its database and log in /p/.prefect "
                     "(0.2 MiB free there); free some, or set PREFECT_HOME to another disk "
                     "(it exited before writing anything)")


@pytest.mark.parametrize("line", [SQLITE_FULL, "OSError: [Errno 28] No space left on device: 'prefect.db'"])
def test_a_log_that_shows_a_full_disk_reads_enospc_whatever_the_free_space(line: str) -> None:
    cause = prefect_server._cause(["Traceback (most recent call last):", line], Path("/p/.prefect"), 5000.0)
    assert cause.startswith("no space left on device (ENOSPC): ") and cause.endswith(f"({line})")


def test_other_failures_keep_their_own_cause() -> None:
    line = "sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) unable to open database file"
    assert prefect_server._cause(["Traceback", line, "  more"], Path("/p"), 5000.0) == line
    assert prefect_server._cause([], Path("/p"), None) == "it exited before writing anything"
    assert prefect_server._cause([], Path("/p"), prefect_server.LOW_FREE_MB) == "it exited before writing anything"


class Keeper:
    """A keeper that exited at once, having written nothing (its log could not grow)."""

    pid = 2**22 + 1  # no process has it

    def __init__(self, *args, **kwargs) -> None:
        pass

    def poll(self) -> int:
        return 1


def test_a_stage_whose_server_met_a_full_disk_says_enospc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / ".prefect"
    home.mkdir()
    monkeypatch.setattr(prefect_server.subprocess, "Popen", Keeper)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(total=2**33, used=2**33, free=2**19))
    with pytest.raises(prefect_server.ServerFailed) as raised:
        prefect_server._start(home, lambda line: None)
    first = str(raised.value).splitlines()[0]
    assert first == (f"the project's Prefect server could not start: no space left on device (ENOSPC): the server "
                     f"needs room for its database and log in {home} (0.5 MiB free there); free some, or set "
                     f"PREFECT_HOME to another disk (it exited before writing anything) "
                     f"(full log: {home / 'logs' / 'server.log'})")
