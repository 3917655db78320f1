"""Stage partition reads each raw ``.csv.gz`` whole before any server starts: a text file whose gzip stream was cut
short (an interrupted copy or download: its header and first rows still read) stops ``python -m flows.stage
partition`` with exit 2 and one ``error:`` line naming the file, nothing written; the intact file passes."""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest
import yaml

import flows.stage
from flows.stage import main
from otfed.data.text.raw import RAW_FILES
from tests.stages.conftest import REPO

# the ERC task reads two raw files, DailyDialog's and MELD's (the smallest embedded ones); MELD's is cut short
ERC = {"dataset": "dailydialog", "locals": ["dd_chunk1", "meld"], "global_party": "dd_chunk2",
       "transfer": "dd_chunk3", "max_train": 30, "max_eval": 10, "max_transfer": 20, "audit": 5}
FILES = [RAW_FILES["dailydialog"], RAW_FILES["meld"]]
RAW = RAW_FILES["meld"]


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder whose ``raw/`` holds the embedded ERC files."""
    (tmp_path / "raw").mkdir()
    for name in FILES:
        (tmp_path / "raw" / name).write_bytes((REPO / "data" / "raw" / name).read_bytes())
    params = {"run": {"seed": 0, "device": "cpu", "task_runner": "sequential", "max_workers": 1},
              "partition": {"data_dir": "raw", "text": {"tasks": {"erc": ERC}}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_raw_csv_gz_cut_short_is_named_before_the_flow(ws: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    started: list[str] = []
    monkeypatch.setattr(flows.stage, "_run_flow", lambda the_stage, *a, **kw: started.append(the_stage.name) or 0)
    assert main("partition", params_path="params.yaml", argv=[]) == 0, capsys.readouterr().err  # intact: passes
    assert started == ["partition"]

    raw = ws / "raw" / RAW
    whole = raw.read_bytes()
    raw.write_bytes(whole[: len(whole) // 2])  # the second half of the gzip stream is lost
    with gzip.open(raw, "rt") as f:  # what a header-only check would see: the header and the first rows read
        assert f.readline().strip() and f.readline().strip()

    def no_flow(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("the preflight let the stage start its Prefect flow")

    monkeypatch.setattr(flows.stage, "_run_flow", no_flow)
    before = _files(ws)
    capsys.readouterr()
    assert main("partition", params_path="params.yaml", argv=[]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"error: raw/{RAW}: cannot read CSV (EOFError: "), err
    assert _files(ws) == before
