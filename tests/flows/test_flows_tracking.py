"""MLflow tracking: tags, params, metrics, nested runs and logged tables/figures land in the store.

The tests with writer processes wait on events (a process's exit, a file it writes, a log line) under ceilings
that only catch a hang (tests/ceilings.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Iterator

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import mlflow
import pandas as pd
import pytest

from flows import tracking
from otfed import io
from tests.ceilings import ceiling, finished, wait_until

# ceilings (tests/ceilings.py), several times the durations on a loaded 2-core machine: idle, a writer process
# starts (imports, opens its run) in ~5 s and ends within ~30 s; the locked store's writers report the lock ~20 s
# after the gate opens
WRITER_START_S = 300
WRITER_S = 600
LOCK_S = 300


def test_stage_run_logs_everything(mlflow_uri: str, tmp_path: Path) -> None:
    assert tracking.tracking_uri() == mlflow_uri
    with tracking.stage_run("demo", {"a.b": "1", "c": "x"}, "abc123") as run:
        run.log_metrics({"score": 0.5, "bad": float("nan")})
        for path in (io.write_csv(pd.DataFrame({"x": [1, 2]}), tmp_path / "t.csv"),
                     io.write_text("| x |\n", tmp_path / "t.md")):
            run.log_artifact(path)
        fig, ax = plt.subplots()
        ax.plot([0, 1])
        run.log_artifact(io.save_figure(fig, tmp_path / "f.png"))
        with run.child("variant-A", tags={"method": "A"}) as child:
            child.log_metrics({"score": 0.7}, step=3)
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    parent = client.get_run(run.run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["stage"] == "demo"
    assert parent.data.tags["params_hash"] == "abc123"
    assert parent.data.tags["git_commit"]
    assert parent.data.params == {"a.b": "1", "c": "x"}
    assert parent.data.metrics == {"score": 0.5}  # NaN is not logged
    artifacts = {a.path for a in client.list_artifacts(run.run_id, tmp_path.name)}
    assert {f"{tmp_path.name}/t.csv", f"{tmp_path.name}/t.md", f"{tmp_path.name}/f.png"} <= artifacts
    kids = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{run.run_id}'")
    assert len(kids) == 1 and kids[0].data.metrics["score"] == 0.7 and kids[0].data.tags["variant"] == "variant-A"


def test_failed_stage_marks_run_failed(mlflow_uri: str) -> None:
    try:
        with tracking.stage_run("demo", {}, "h") as run:
            raise KeyError("boom")
    except KeyError:
        pass
    status = mlflow.MlflowClient(tracking_uri=mlflow_uri).get_run(run.run_id).info.status
    assert status == "FAILED"


WRITER = """
import sys
from flows import tracking
with tracking.stage_run(sys.argv[1], {"k": sys.argv[1]}, "h") as run:
    run.log_metrics({"score": 1.0})
"""


@pytest.mark.integration
def test_two_stages_starting_at_once_on_a_fresh_store_both_finish(tmp_path: Path, monkeypatch) -> None:
    """A fresh mlruns.db is created and migrated once, under a lock: two processes that start together both
    log their run, and the store works afterwards (without the lock MLflow's schema migration races)."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    db = tmp_path / "mlruns.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(OTFED_HOME=str(tmp_path), PYTHONPATH=str(repo))
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, f"stage{i}"], cwd=tmp_path, env=env,
                              stderr=subprocess.PIPE, text=True) for i in range(3)]
    errors = [finished(p, f"writer stage{i} to exit", WRITER_S)[1] for i, p in enumerate(procs)]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(e[-2000:] for e in errors)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("otfed")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # opens on the runs view
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.data.tags["stage"] for r in runs) == ["stage0", "stage1", "stage2"]
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert Path(exp.artifact_location.removeprefix("file://")) == tmp_path / "mlartifacts"


def test_git_commit_ignores_outputs_and_names_the_experiment_baseline(tmp_path: Path, monkeypatch) -> None:
    """``-dirty`` means the code differs from the commit; DVC's rewrites of outputs and dvc.lock do not
    count. Under ``dvc exp run`` the commit is the experiment's baseline."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    for name in ("dvc.lock", "otfed/x.py", "reports/a.csv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("1\n")
    git("add", "-A")
    git("-c", "user.email=t@e.org", "-c", "user.name=t", "commit", "-qm", "c")
    sha = git("rev-parse", "HEAD").strip()
    monkeypatch.delenv("DVC_EXP_BASELINE_REV", raising=False)
    (tmp_path / "dvc.lock").write_text("2\n")
    (tmp_path / "reports/a.csv").write_text("2\n")
    assert tracking.git_commit(tmp_path) == sha
    (tmp_path / "otfed/x.py").write_text("2\n")
    assert tracking.git_commit(tmp_path) == sha + "-dirty"
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", "b" * 40)
    assert tracking.git_commit(tmp_path).startswith("b" * 40)


# ------------------------------------------------------------------------- concurrent writers, locked store
def test_retry_while_locked_waits_out_the_lock_and_nothing_else(monkeypatch) -> None:
    """Only SQLite's ``database is locked`` (however MLflow wraps it) is retried, with growing delays; any
    other error, or a lock outlasting ``OTFED_TRACKING_RETRY_S``, is raised (the latter with a note)."""
    import sqlite3

    from mlflow.exceptions import MlflowException

    slept: list[float] = []
    monkeypatch.setattr(tracking.time, "sleep", slept.append)
    monkeypatch.delenv(tracking.RETRY_ENV, raising=False)

    def locked() -> MlflowException:  # what MLflow's managed session raises: sqlite3 → SQLAlchemy → Mlflow
        try:
            raise sqlite3.OperationalError("database is locked")
        except sqlite3.OperationalError as exc:
            return MlflowException(f"(sqlite3.OperationalError) {exc}")

    calls: list[int] = []

    def flaky(x: int, times: int) -> int:
        calls.append(x)
        if len(calls) <= times:
            raise locked()
        return 2 * x

    assert tracking.retry_while_locked(flaky, 21, times=6) == 42
    assert calls == [21] * 7 and len(slept) == 6
    caps = [min(tracking.RETRY_MAX_DELAY_S, tracking.RETRY_FIRST_DELAY_S * 2 ** i) for i in range(6)]
    assert all(cap / 2 <= s <= cap for s, cap in zip(slept, caps)), (slept, caps)  # backoff with jitter

    def refused() -> None:
        calls.append(0)
        raise MlflowException("Changing param values is not allowed")

    calls.clear()
    with pytest.raises(MlflowException, match="Changing param values"):  # not a lock: raised at once
        tracking.retry_while_locked(refused)
    assert calls == [0]

    monkeypatch.setenv(tracking.RETRY_ENV, "0")  # no retry: one attempt, the error says why
    calls.clear()
    with pytest.raises(MlflowException) as info:
        tracking.retry_while_locked(flaky, 1, times=5)
    assert calls == [1]
    assert any("still locked after 1 attempt(s) of flaky" in note for note in info.value.__notes__)


STORE_WRITER = """
import sys, time
from pathlib import Path
from flows import tracking
from otfed import io

name, children, n_params, n_steps, n_batch = sys.argv[1], *map(int, sys.argv[2:6])
art = Path("art"); art.mkdir(exist_ok=True)
gate, gate_ceiling = (sys.argv[6], float(sys.argv[7])) if len(sys.argv) > 7 else (None, 0.0)

def log_everything(run, label):
    for s in range(n_steps):  # one metric per call
        run.log_metrics({"loss": float(s)}, step=s)
    run.log_metrics({f"m{i}": float(i) for i in range(n_batch)})  # batches of 500
    run.set_tags({f"t{i}": i for i in range(3)})  # one tag per call
    path = art / f"{label}.txt"
    path.write_text(label)
    run.log_artifact(path)

with tracking.stage_run(name, {f"p{i}": i for i in range(n_params)}, "h") as run:  # batches of 100
    if gate:  # tell the test the run exists, wait for it to lock the store
        Path(f"{name}.started").write_text(run.run_id)
        deadline = time.monotonic() + gate_ceiling  # only a test that died leaves the gate closed
        while not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    try:
        log_everything(run, name)
    except Exception as exc:  # tell the test at once: the run only ends (FAILED) once it can write again
        print(f"{name} failed: {exc}", file=sys.stderr, flush=True)
        raise
    for c in range(children):
        with run.child(f"{name}-c{c}") as child:
            child.log_params({f"p{i}": i for i in range(n_params)})
            log_everything(child, f"{name}-c{c}")
"""


def _writer_env(home: Path) -> dict[str, str]:
    """The environment of a writer process: the store ``<home>/mlruns.db``, this checkout's code."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "OTFED_", "DVC_"))}
    env.update(OTFED_HOME=str(home), PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return env


def _check_runs_complete(client, runs: list, n_params: int, n_steps: int, n_batch: int, tmp: Path) -> None:
    """Every run FINISHED with exactly the params, metrics (each step of ``loss``), tags and artifact its
    writer logged (STORE_WRITER); the artifact's bytes are the run's label."""
    for run in runs:
        label = run.info.run_name
        assert run.info.status == "FINISHED", label
        assert run.data.params == {f"p{i}": str(i) for i in range(n_params)}, label
        assert run.data.metrics == {"loss": float(n_steps - 1), **{f"m{i}": float(i) for i in range(n_batch)}}
        history = client.get_metric_history(run.info.run_id, "loss")
        assert sorted((m.step, m.value) for m in history) == [(s, float(s)) for s in range(n_steps)], label
        assert {k: v for k, v in run.data.tags.items() if k.startswith("t")} == {f"t{i}": str(i) for i in range(3)}
        assert [a.path for a in client.list_artifacts(run.info.run_id, "art")] == [f"art/{label}.txt"], label
        local = client.download_artifacts(run.info.run_id, f"art/{label}.txt", str(tmp))
        assert Path(local).read_text() == label


@pytest.fixture
def start_writers(tmp_path: Path) -> Iterator[Callable[..., dict[str, subprocess.Popen]]]:
    """``start_writers(gate, n_params, n_steps, n_batch, children, name=extra_env, ...)``: one STORE_WRITER
    process per name (with its extra environment) on ``<tmp_path>/mlruns.db``; returns once every one has
    opened its run and waits for the file ``gate`` (so their writes overlap; a writer gives up waiting at
    ``ceiling(WRITER_S)``). Teardown kills any left."""
    started: list[subprocess.Popen] = []

    def start(gate: Path, n_params: int, n_steps: int, n_batch: int, children: int,
              **extra_env: dict[str, str]) -> dict[str, subprocess.Popen]:
        procs = {name: subprocess.Popen([sys.executable, "-c", STORE_WRITER, name, str(children), str(n_params),
                                         str(n_steps), str(n_batch), str(gate), str(ceiling(WRITER_S))],
                                        cwd=tmp_path, env={**_writer_env(tmp_path), **extra}, stderr=subprocess.PIPE,
                                        text=True)
                 for name, extra in extra_env.items()}
        started.extend(procs.values())

        def states() -> str:
            return "; ".join(f"{n}: " + (f"exit {p.poll()} {p.communicate()[1][-2000:]}" if p.poll() is not None
                                         else "run open" if (tmp_path / f"{n}.started").exists() else "starting")
                             for n, p in procs.items())

        def all_started() -> bool:
            if any(p.poll() is not None for p in procs.values()):
                pytest.fail(f"a writer exited before the gate opened: {states()}")
            return all((tmp_path / f"{name}.started").exists() for name in procs)

        wait_until(all_started, "every writer to open its run", WRITER_START_S, poll=0.05, details=states)
        return procs

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.mark.integration
def test_concurrent_writer_processes_on_one_fresh_store_lose_nothing(mlflow_uri: str, tmp_path: Path,
                                                                     start_writers) -> None:
    """Three processes write at once into one fresh store (the migrated empty template): each a stage run and
    a child run, params in batches of 100, a metric per call over many steps, 520 metrics in batches of 500,
    tags one by one, an artifact per run — released together once every run exists, so their writes
    contend. Afterwards every run is FINISHED and every value is there, counted exactly. (MLflow's 20 s
    SQLite busy timeout already absorbs this much contention; the next test goes past it.)"""
    children, n_params, n_steps, n_batch = 1, 150, 60, 520
    gate = tmp_path / "go"
    procs = start_writers(gate, n_params, n_steps, n_batch, children, w0={}, w1={}, w2={})
    gate.write_text("")
    errors = [finished(p, f"writer {name} to exit", WRITER_S)[1] for name, p in procs.items()]
    assert [p.returncode for p in procs.values()] == [0] * len(procs), "\n".join(e[-3000:] for e in errors)
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("otfed").experiment_id], max_results=1000)
    assert sorted(r.info.run_name for r in runs) == sorted([*procs, *(f"{w}-c{c}" for w in procs
                                                                     for c in range(children))])
    kids = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    parents = {r.info.run_name: r.info.run_id for r in runs if r not in kids}
    assert all(r.data.tags["mlflow.parentRunId"] == parents[r.info.run_name.split("-")[0]] for r in kids)
    _check_runs_complete(client, runs, n_params, n_steps, n_batch, tmp_path / "download")


def _read_stderr(procs: dict[str, subprocess.Popen]) -> tuple[dict[str, list[str]], list[threading.Thread]]:
    """Each process's stderr lines as they come (a thread per process reads them), and those threads."""
    lines: dict[str, list[str]] = {name: [] for name in procs}

    def read(name: str) -> None:
        for line in procs[name].stderr:
            lines[name].append(line)

    threads = [threading.Thread(target=read, args=(name,), daemon=True) for name in procs]
    for thread in threads:
        thread.start()
    return lines, threads


@pytest.mark.integration
def test_a_write_lock_held_past_mlflows_busy_timeout_is_waited_out(mlflow_uri: str, tmp_path: Path,
                                                                   start_writers) -> None:
    """Another process holds the store's write lock longer than MLflow's SQLite busy timeout (20 s) while two
    stage runs are mid-way: the run with the retry (the default) finishes with everything it logged; the
    control run, with the retry switched off (``OTFED_TRACKING_RETRY_S=0``), fails with ``database is
    locked`` and loses its metrics — what every run did before the retry.

    The lock is held until each writer has met it, whatever the machine's load: the retrying writer is let
    through its gate first and the test waits until it reports the lock (one attempt waited out the busy
    timeout); then the control writer, until its write fails. Released then, the control ends its run (FAILED)
    and the retrying writer's next attempt goes through."""
    import sqlite3

    n_params, n_steps, n_batch = 30, 10, 50
    gates = {name: tmp_path / f"go-{name}" for name in ("retrying", "control")}
    procs = {**start_writers(gates["retrying"], n_params, n_steps, n_batch, 1, retrying={}),
             **start_writers(gates["control"], n_params, n_steps, n_batch, 1, control={tracking.RETRY_ENV: "0"})}
    stderr, readers = _read_stderr(procs)
    holder = sqlite3.connect(tmp_path / "mlruns.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock (readers go on), e.g. a long `mlflow gc` or import
    try:  # the fault itself: a lock held past each writer's busy timeout
        for name, sign in (("retrying", "MLflow store locked during"), ("control", "control failed:")):
            gates[name].write_text("")
            proc, seen = procs[name], stderr[name]
            wait_until(lambda: proc.poll() is not None or any(sign in line for line in seen),
                       f"the {name} writer to report the locked store ({sign!r})", LOCK_S, poll=0.1,
                       details=lambda: "".join(seen[-40:]))
    finally:
        holder.execute("COMMIT")
        holder.close()
    for name, proc in procs.items():
        seen = stderr[name]
        wait_until(lambda: proc.poll() is not None, f"writer {name} to exit", WRITER_S,
                   details=lambda: "".join(seen[-40:]))
    for thread in readers:
        thread.join()
    errors = {name: "".join(lines) for name, lines in stderr.items()}

    assert procs["control"].returncode != 0 and "database is locked" in errors["control"]  # the fault is real
    assert procs["retrying"].returncode == 0, errors["retrying"][-3000:]
    assert "MLflow store locked during" in errors["retrying"]  # it did hit the lock, and waited it out
    assert "still locked after 1 attempt(s)" in errors["control"]  # the error says the store stayed locked

    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    runs = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name("otfed").experiment_id])}
    assert sorted(runs) == ["control", "retrying", "retrying-c0"]  # the control never got to its child
    control = runs.pop("control")
    assert control.info.status == "FAILED"
    assert len(client.get_metric_history(control.info.run_id, "loss")) < n_steps  # lost
    _check_runs_complete(client, list(runs.values()), n_params, n_steps, n_batch, tmp_path / "download")


def test_runs_a_killed_process_left_running_are_marked_killed_by_the_next_stage(mlflow_uri: str) -> None:
    """SIGKILL / the OOM killer end a stage without ending its MLflow run: the next stage run marks every run
    whose owning process is gone KILLED — and leaves a live process's run, another host's run and a run
    without owner tags as they are."""
    import socket
    import subprocess
    import sys

    import mlflow
    import psutil

    from flows import tracking

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_started = repr(psutil.Process(dead.pid).create_time())
    dead.wait()
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    exp = client.create_experiment("otfed")
    host = socket.gethostname()
    owners = {"dead": (host, str(dead.pid), dead_started), "live": tuple(tracking.owner_tags().values()),
              "elsewhere": ("another-host", str(dead.pid), dead_started)}
    ids = {name: client.create_run(exp, tags=dict(zip(tracking.OWNER, owner))).info.run_id
           for name, owner in owners.items()}
    ids["untagged"] = client.create_run(exp).info.run_id
    assert tracking.close_abandoned_runs(client, exp) == [ids["dead"]]
    status = {name: client.get_run(run_id).info.status for name, run_id in ids.items()}
    assert status == {"dead": "KILLED", "live": "RUNNING", "elsewhere": "RUNNING", "untagged": "RUNNING"}
    with tracking.stage_run("partition", {"a": "1"}, "h") as run:  # the next stage: its own run is live
        assert client.get_run(run.run_id).info.status == "RUNNING"
        assert client.get_run(run.run_id).data.tags["otfed.pid"] == str(__import__("os").getpid())
    assert client.get_run(ids["live"]).info.status == "RUNNING"
