"""Stage fed_distance refuses, before any server starts, a compared federation (federated OTDD, clustering) left
with fewer than two usable clients: ``python -m flows.stage fed_distance`` exits 2 with one ``error:`` line naming
the federation and the client left out, and writes nothing. The same federation with both clients usable passes.

The federation is the two-client ``bench`` of tests/stages/test_preflight.py (MNIST and USPS rows, one client
each), written straight into ``data/partitions`` (no partition run); one NaN feature makes USPS unusable."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import flows.stage
from flows.stage import main
from otfed.data.federations import build_federation
from otfed.data.store import save_federation
from stages import layout
from stages.params import validate_params
from tests.stages.test_preflight import BENCH, preflight_params

DISTANCE_ONLY = ("run", "partition", "fed_distance")


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder with params for fed_distance on ``bench`` and no partition file yet."""
    params = {k: v for k, v in preflight_params().items() if k in DISTANCE_ONLY}
    params["partition"] = {**params["partition"], "federations": {"bench": BENCH}}
    params["partition"].pop("text")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_bench(nan_client: str | None) -> None:
    """``data/partitions/bench.npz`` as stage partition writes it; with one NaN feature in ``nan_client``'s rows."""
    p = validate_params(yaml.safe_load(Path("params.yaml").read_text()))
    data, _ = build_federation("bench", p.partition.federations["bench"], p.partition.data_dir, p.run.seed)
    if nan_client is not None:
        x = data.x.astype(np.float32, copy=True)
        x[np.flatnonzero(data.client == data.client_names.index(nan_client))[3], 5] = np.nan
        data = dataclasses.replace(data, x=x)
    Path(layout.PARTITIONS).mkdir(parents=True, exist_ok=True)
    save_federation(data, layout.PARTITIONS)


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_one_usable_client_is_refused_before_the_flow(ws: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    started: list[str] = []
    monkeypatch.setattr(flows.stage, "_run_flow", lambda the_stage, *a, **kw: started.append(the_stage.name) or 0)
    write_bench(nan_client=None)
    assert main("fed_distance", params_path="params.yaml", argv=[]) == 0, capsys.readouterr().err
    assert started == ["fed_distance"]  # the positive control: two usable clients pass

    def no_flow(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("the preflight let the stage start its Prefect flow")

    monkeypatch.setattr(flows.stage, "_run_flow", no_flow)
    write_bench(nan_client="usps")
    before = _files(ws)
    capsys.readouterr()
    assert main("fed_distance", params_path="params.yaml", argv=[]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: federation 'bench': fewer than 2 usable clients; client 'usps'"), err
    assert _files(ws) == before
