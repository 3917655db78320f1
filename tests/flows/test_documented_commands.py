"""Every server command the docs show listens on the loopback interface only, as the docs promise.

The commands are read from the pages themselves (README.md and docs/**/*.md): every line of a fenced code block
and every inline code span with arguments that starts a server — ``dask scheduler``, ``dask worker``, ``prefect
server start``, ``mlflow ui`` / ``mlflow server``, ``mkdocs serve`` — and ``make mlflow-server``, whose ``mlflow
server`` line ``make -n`` prints. A bare program name in prose (a `` `dask worker` `` process) is a name, not a
command. Each command runs as written, in a throw-away folder (``mkdocs serve`` in the repository, where its
``mkdocs.yml`` is), with three changes that cannot move a listening address: every documented port becomes a
free one (one free port per documented port, so a worker still finds its scheduler), ``--nworkers`` becomes 1, and
the placeholder checkout path becomes the throw-away folder. They run with ``PREFECT_SERVER_API_HOST`` and
``MLFLOW_HOST`` set to 0.0.0.0, as a user's shell or profile may have them: a documented command must pin
loopback itself. Once a command's ports answer (and a worker has joined its scheduler), the listening TCP sockets
of its whole process tree are read (psutil, as ``/proc/net/tcp*`` lists them per process); each must be on
127.0.0.1 or ::1. Two different servers documented on one port run in turn, not together.
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.ceilings import ceiling, tail, wait_until
from tests.integration.support import REPO, clean_env, free_port

LOOPBACK = {"127.0.0.1", "::1"}
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# the server programs, as a command starts them (after VAR=value assignments; a program may be given by path)
SERVERS = {
    "dask scheduler": r"(?:\S*/)?dask scheduler\b",
    "dask worker": r"(?:\S*/)?dask worker\b",
    "prefect server": r"(?:\S*/)?prefect server start\b",
    "mlflow": r"(?:\S*/)?mlflow (?:ui|server)\b",
    "mkdocs serve": r"(?:\S*/)?python -m mkdocs serve\b|(?:\S*/)?mkdocs serve\b",
    "make mlflow-server": r"make mlflow-server\b",
}
CHECKOUT_PLACEHOLDER = "/path/to/this/checkout"
HOSTILE = {"PREFECT_SERVER_API_HOST": "0.0.0.0", "MLFLOW_HOST": "0.0.0.0"}
# ceilings (tests/ceilings.py): a Prefect server takes ~10-20 s to answer on a loaded 2-core machine, mkdocs
# builds the site (~25 s) before it listens
START_S = 300
STOP_S = 30


@dataclass
class Command:
    """A server command as a page shows it: its text, its kind (a key of SERVERS), where it is shown."""

    text: str
    kind: str
    where: list[str] = field(default_factory=list)

    def ports(self) -> list[int]:
        """The ports it names: where it listens (and, for a worker, the scheduler it joins); 0 = any."""
        return [int(p) for p in re.findall(r"(?:--port[ =]|:)(\d{1,5})\b", self.text)]

    def scheduler_port(self) -> int | None:
        found = re.search(r"tcp://[^\s:]+:(\d+)", self.text) if self.kind == "dask worker" else None
        return int(found.group(1)) if found else None

    def listening_ports(self) -> set[int]:
        return {p for p in self.ports() if p} - {self.scheduler_port()}


def _program_of(command: str) -> str | None:
    """The server kind ``command`` starts (its last ``&&`` part, after env assignments), or None."""
    last = command.split("&&")[-1].strip()
    words = last.split()
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[0]):
        words.pop(0)
    rest = " ".join(words)
    for kind, pattern in SERVERS.items():
        if re.match(pattern, rest):
            return kind
    return None


def _is_command(text: str, kind: str) -> bool:
    """Whether an inline span is a command — it gives the program arguments, an environment or a folder — rather
    than a program's name (a make target is always a command)."""
    if kind == "make mlflow-server":
        return True
    last = text.split("&&")[-1].strip()
    match = re.search(SERVERS[kind], last)
    return match is not None and bool(last[:match.start()].strip() or last[match.end():].strip()) \
        or "&&" in text


def documented(pages: list[Path] = PAGES) -> list[Command]:
    """Every server command the pages show (module docstring), once each, in page order."""
    found: dict[str, Command] = {}

    def add(text: str, where: str, inline: bool) -> None:
        text = re.sub(r"\s+#\s.*$", "", text).strip().rstrip("&").strip()
        text = " ".join(text.split())
        kind = _program_of(text)
        if kind is None or (inline and not _is_command(text, kind)):
            return
        found.setdefault(text, Command(text, kind)).where.append(where)

    for page in pages:
        name = str(page.relative_to(REPO))
        prose: list[str] = []
        block: list[str] | None = None
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                block = [] if block is None else None
                continue
            if block is None:
                prose.append(line)
                continue
            block.append(line)
            if line.rstrip().endswith("\\"):
                continue
            add(" ".join(part.rstrip().rstrip("\\") for part in block), f"{name}:{number}", inline=False)
            block.clear()
        for span in re.findall(r"`([^`]+)`", "\n".join(prose)):
            add(span.replace("\n", " "), name, inline=True)
    return list(found.values())


def _make_target(command: Command, folder: Path) -> Command:
    """``make mlflow-server`` → the ``mlflow server`` command its recipe runs (``make -n``: nothing is run), with
    its store in ``folder``."""
    (folder / "artifacts").mkdir(parents=True)  # what the recipe's `mkdir -p` line would make
    out = subprocess.run(["make", "-n", "-s", "mlflow-server", f"MLFLOW_SERVER_DIR={folder}"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    line = next(part for part in out.replace("\\\n", " ").splitlines() if _program_of(part) == "mlflow")
    return Command(" ".join(line.split()), "mlflow", [f"make mlflow-server ({', '.join(command.where)})"])


def rounds(commands: list[Command]) -> list[list[Command]]:
    """The commands in groups that can run together: no two servers of a group on one documented port, each
    worker with a scheduler listening where it connects."""
    groups: list[list[Command]] = []
    for command in (c for c in commands if c.kind != "dask worker"):
        for group in groups:
            if not any(command.listening_ports() & other.listening_ports() for other in group):
                group.append(command)
                break
        else:
            groups.append([command])
    for worker in (c for c in commands if c.kind == "dask worker"):
        home = next((g for g in groups for c in g if c.kind == "dask scheduler"
                     and worker.scheduler_port() in c.listening_ports()), None)
        assert home is not None, (f"{worker.where}: `{worker.text}` joins port {worker.scheduler_port()}, where no "
                                  "documented `dask scheduler` listens")
        home.append(worker)
    return groups


def _runnable(command: Command, ports: dict[int, int], folder: Path) -> str:
    """The text to run: documented ports → free ones, ``--nworkers`` → 1, the placeholder checkout → ``folder``."""
    text = command.text.replace(CHECKOUT_PLACEHOLDER, str(folder))
    text = re.sub(r"--nworkers[ =]\S+", "--nworkers 1", text)
    return re.sub(r"(--port[ =]|:)(\d{1,5})\b", lambda m: m.group(1) + str(ports.get(int(m.group(2)),
                                                                                        int(m.group(2)))), text)


def _answers(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _family(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def listening(pid: int) -> list[tuple[str, int, int, str]]:
    """Every listening TCP socket of process ``pid`` and its descendants: (address, port, pid, name)."""
    found = []
    for proc in _family(pid):
        try:
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((conn.laddr.ip, conn.laddr.port, proc.pid, proc.name()))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _stop(started: list[tuple[Command, subprocess.Popen, Path]]) -> None:
    """SIGTERM each command's process group (its own session), then SIGKILL what is left of its process tree —
    processes named by psutil (pid and start time) while they were its descendants."""
    families = {proc.pid: _family(proc.pid) for _, proc, _ in started}
    for _, proc, _ in reversed(started):
        if proc.poll() is None:  # not reaped: its pid, the id of the session started for it, is still its own
            os.killpg(proc.pid, signal.SIGTERM)
    for _, proc, _ in reversed(started):
        try:
            proc.wait(timeout=ceiling(STOP_S))
        except subprocess.TimeoutExpired:
            pass
        for member in families[proc.pid]:
            try:
                member.kill()  # psutil checks the start time: a recycled pid is left alone
            except psutil.NoSuchProcess:
                pass
        proc.wait(timeout=ceiling(STOP_S))


def test_the_docs_show_every_kind_of_server_with_a_port() -> None:
    """The extraction finds the servers the docs offer (so the test below checks something), and each but a
    worker names its port (so that it can be moved to a free one)."""
    commands = documented()
    kinds = {c.kind for c in commands}
    assert kinds >= set(SERVERS), f"no documented command found for {set(SERVERS) - kinds}"
    for command in commands:
        if command.kind not in ("dask worker", "make mlflow-server"):
            assert command.listening_ports(), (f"{command.where}: `{command.text}` names no port: give it one "
                                               "(the docs' servers name their address and port)")
    workers = [c for c in commands if c.kind == "dask worker"]
    assert len(workers) >= 2 and all(w.scheduler_port() == 8786 for w in workers)


@pytest.mark.integration
@pytest.mark.slow
def test_every_documented_server_listens_on_loopback_only(tmp_path: Path) -> None:
    commands = [_make_target(c, tmp_path / "mlflow-server") if c.kind == "make mlflow-server" else c
                for c in documented()]
    (tmp_path / ".venv").symlink_to(REPO / ".venv")  # the worker line's `eval "$(.venv/bin/python …)"`
    env = clean_env(PYTHONPATH=str(REPO), **HOSTILE)
    report = []
    for group in rounds(commands):
        ports = {p: free_port(f"the server on documented port {p}") for c in group for p in c.ports() if p}
        started: list[tuple[Command, subprocess.Popen, Path]] = []
        try:
            # the servers start together; the workers once their scheduler answers
            for batch in ([c for c in group if c.kind != "dask worker"], [c for c in group if c.kind == "dask worker"]):
                for command in batch:
                    log = tmp_path / f"server-{len(report) + len(started)}.log"
                    with open(log, "wb") as out:
                        proc = subprocess.Popen(["bash", "-c", _runnable(command, ports, tmp_path)],
                                                cwd=REPO if command.kind == "mkdocs serve" else tmp_path, env=env,
                                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
                    started.append((command, proc, log))
                for command, proc, log in started[-len(batch):] if batch else []:
                    _wait_ready(command, proc, log, ports, group)
            for command, proc, log in started:
                sockets = listening(proc.pid)
                report.append((command, sockets))
                assert sockets, f"{command.where}: `{command.text}` listens nowhere:\n{tail(log.read_text())}"
                for port in command.listening_ports():
                    assert any(p == ports[port] for _, p, _, _ in sockets), \
                        f"{command.where}: `{command.text}` does not listen on its documented port {port}"
        finally:
            _stop(started)
    exposed = [f"{', '.join(c.where)}: `{c.text}` listens on {ip} port {port} ({name}, pid {pid})"
               for c, sockets in report for ip, port, pid, name in sockets if ip not in LOOPBACK]
    assert not exposed, "documented servers listening beyond loopback:\n" + "\n".join(exposed)
    assert {c.kind for c, _ in report} >= set(SERVERS) - {"make mlflow-server"}


def _wait_ready(command: Command, proc: subprocess.Popen, log: Path, ports: dict[int, int],
                group: list[Command]) -> None:
    """Until the command serves: every port it listens on answers; a worker: all of its scheduler's workers have
    joined. A command that exits first fails the test with its output."""
    def alive() -> None:
        if proc.poll() is not None:
            pytest.fail(f"{command.where}: `{command.text}` exited with {proc.returncode}:\n{tail(log.read_text())}")

    def ready() -> bool:
        alive()
        if command.kind == "dask worker":  # each worker command starts one worker (--nworkers 1)
            joining = [c for c in group if c.kind == "dask worker" and c.scheduler_port() == command.scheduler_port()]
            return _workers(ports[command.scheduler_port()]) >= len(joining)
        if not command.listening_ports():  # a port of its program's choosing: once it listens anywhere
            return bool(listening(proc.pid))
        return all(_answers(ports[p]) for p in command.listening_ports())

    wait_until(ready, f"`{command.text}` to serve", START_S, poll=0.5, details=lambda: tail(log.read_text()))


def _workers(port: int) -> int:
    """How many workers the Dask scheduler on ``port`` has now."""
    from distributed import Client

    try:
        with Client(f"tcp://127.0.0.1:{port}", timeout=10, set_as_default=False) as client:
            return len(client.scheduler_info(n_workers=-1).get("workers", {}))
    except (OSError, TimeoutError):
        return 0


def test_the_runnable_command_only_moves_ports_workers_and_the_checkout(tmp_path: Path) -> None:
    worker = Command(f"cd {CHECKOUT_PLACEHOLDER} && dask worker tcp://127.0.0.1:8786 --host 127.0.0.1 "
                     "--dashboard-address 127.0.0.1:0 --nworkers 8 --nthreads 1", "dask worker")
    assert _runnable(worker, {8786: 40001}, tmp_path) == (
        f"cd {tmp_path} && dask worker tcp://127.0.0.1:40001 --host 127.0.0.1 --dashboard-address 127.0.0.1:0 "
        "--nworkers 1 --nthreads 1")
    assert shlex.split(_runnable(Command("prefect server start --host 127.0.0.1 --port 4200", "prefect server"),
                                 {4200: 40002}, tmp_path))[-2:] == ["--port", "40002"]
