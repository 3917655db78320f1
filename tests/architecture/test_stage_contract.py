"""The new-stage checklist, for every stage at once (issue #23 item 7): every place a contributor edits to add a
stage (``stages/stage.py``, "Adding a stage") is checked by ``tests/architecture/stage_contract.py``, and one
failure lists every missing item of every stage, naming the stage, the item and the file to edit.

The checker is shown not to be vacuous: a stage record injected into the discovery (``stages.params.stages``)
that has none of the items is named once per item, and a real stage with one item broken is named for that item
only."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterator, Mapping

import pytest

import stages.params
from otfed.schema import Strict
from stages.stage import Job, Stage
from tests.architecture.stage_contract import CHECKLIST, problems, stage_problems


def test_every_stage_has_every_item_of_the_checklist() -> None:
    found = problems()
    assert not found, (f"{len(found)} item(s) of the new-stage checklist missing (stages/stage.py, \"Adding a "
                       "stage\"):\n" + "\n".join(found))


class FakeParams(Strict):
    """A params group no params file has."""

    size: int = 1


def _jobs(p: Any, dirs: Mapping[str, Any]) -> list[Job]:
    return [Job("one", int, key=("one",))]


def _report(p: Any, results: Any, out: Any, dirs: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": len(results)}


FAKE = Stage("fake_stage", FakeParams, ("reports/fake_stage", "data/fake_stage"), _jobs, _report)


@pytest.fixture
def with_fake_stage(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Stage]]:
    """Discovery (``stages.params.stages``) finds :data:`FAKE` beside the real stages; the params models built
    meanwhile are forgotten afterwards (they would hold the fake group)."""
    real = stages.params.stages()
    found = {**real, FAKE.name: FAKE}
    stages.params.params_model.cache_clear()
    monkeypatch.setattr(stages.params, "stages", lambda: found)
    yield found
    stages.params.params_model.cache_clear()


@pytest.mark.slow  # the whole checker once more, on a fake stage: a check of the checker
def test_a_stage_lacking_every_item_is_named_for_each(with_fake_stage: dict[str, Stage]) -> None:
    """``fake_stage`` has no module, no layout constant for its data folder, no params group in either file, no
    dvc.yaml block, metrics or plots, no headline, no results-page item, no tiny track and no test file: the
    checker names every item of the checklist for it, with the file to edit — and nothing for the real stages."""
    found = problems()
    mine = [line for line in found if line.startswith("stage fake_stage: ")]
    assert len(mine) == len(found), [line for line in found if line not in mine]  # the real stages: nothing
    for item in CHECKLIST:
        named = [line for line in mine if line.startswith(f"stage fake_stage: {item.name} — ")]
        assert named, f"the checker does not name the missing item {item.name!r}:\n" + "\n".join(mine)
        assert all(line.endswith(f"(edit {item.place.format(name='fake_stage')})") for line in named), named
    assert "stage fake_stage: dvc.yaml cmd — cmd is None; must be 'python -m flows.stage fake_stage' " \
           "(edit dvc.yaml stages.fake_stage.cmd)" in mine
    assert "stage fake_stage: output folders — output folder 'data/fake_stage' is no constant of " \
           "stages/layout.py (edit stages/layout.py)" in mine
    assert "stage fake_stage: params group — no group `fake_stage:` (edit params.yaml)" in mine
    assert "stage fake_stage: headline — Stage(headline=...) is empty (edit stages/fake_stage.py STAGE)" in mine


@pytest.mark.parametrize("change, items", [
    (dict(headline=()), {"headline"}),
    (dict(reads=("partition.federations",)), {"dvc.yaml params"}),
    (dict(outputs=("reports/removal", "data/extra")), {"output folders", "dvc.yaml outs"}),
    (dict(outputs=("reports/elsewhere",)), {"dvc.yaml outs", "dvc.yaml metrics", "dvc.yaml plots",
                                             "output folders"}),
])
def test_a_real_stage_with_one_item_broken_is_named_for_it_only(change: dict[str, Any], items: set[str]) -> None:
    stage = replace(stages.params.stage("noisy_removal"), **change)
    named = {line.split(": ", 1)[1].split(" — ")[0] for line in stage_problems(stage)}
    assert named == items, stage_problems(stage)
