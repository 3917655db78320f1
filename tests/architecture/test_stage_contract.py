"""The new-stage checklist, for every stage at once (issue #23 item 7, issue #36 item 3): every place a contributor
edits to add a stage is an item of ``tests/architecture/stage_contract.py``'s ``CHECKLIST``, checked there, and one
failure lists every missing item of every stage, naming the stage, the item and the file to edit.

The checker is shown not to be vacuous: a stage record injected into the discovery (``stages.params.stages``)
that has none of the items is named once per item, and a real stage with one item broken is named for that item
only. The checklist is written once: ``docs/contributing.md``'s "Adding a stage" list is the rendered
``CHECKLIST``, and the README points there without restating it."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterator, Mapping

import re

import pytest

import stages.params
from otfed.schema import Strict
from stages.stage import Job, Stage
from tests.architecture.stage_contract import (BEGIN, CHECKLIST, CONTRIBUTING, END, REPO, checklist_markdown,
                                               generated_section, problems, stage_problems)


def test_every_stage_has_every_item_of_the_checklist() -> None:
    found = problems()
    assert not found, (f"{len(found)} item(s) of the new-stage checklist missing (docs/contributing.md, \"Adding a "
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
    # two headline metrics (one per federation) are too few
    (dict(headline=("*.auc",)), {"headline"}),
    # an input no stage of the preflight template writes needs a stand-in there (and a data dep)
    (dict(inputs=lambda p: ["reports/valuation/detection.csv"]), {"preflight test", "dvc.yaml data deps"}),
])
def test_a_real_stage_with_one_item_broken_is_named_for_it_only(change: dict[str, Any], items: set[str]) -> None:
    stage = replace(stages.params.stage("noisy_removal"), **change)
    named = {line.split(": ", 1)[1].split(" — ")[0] for line in stage_problems(stage)}
    assert named == items, stage_problems(stage)


def test_the_contributing_page_shows_the_checklist_as_rendered() -> None:
    """``docs/contributing.md``'s "Adding a stage" list is :func:`checklist_markdown` of ``CHECKLIST``, word for word."""
    shown = generated_section((REPO / CONTRIBUTING).read_text(encoding="utf-8"))
    assert shown is not None, f"{CONTRIBUTING} lost the lines {BEGIN!r} … {END!r} around its checklist"
    assert shown == checklist_markdown(), (f"{CONTRIBUTING}'s checklist differs from CHECKLIST in "
                                           "tests/architecture/stage_contract.py: run python -m "
                                           "tests.architecture.stage_contract --write")


def test_every_rule_names_its_file_once_and_the_page_lists_every_item() -> None:
    """Each item is rendered under its file, with its name (the name a failure gives), and each name is unique."""
    names = [item.name for item in CHECKLIST]
    assert len(names) == len(set(names)), names
    shown = checklist_markdown()
    for item in CHECKLIST:
        assert f"`{item.file}`" in shown and f"- *{item.name}*: " in shown, item.name


def test_the_readme_points_to_the_checklist_without_restating_it() -> None:
    """The README names the page and the source of the checklist and gives no count of its own that could go
    stale."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    paragraph = next(p for p in readme.split("\n\n") if "adding a stage" in p)
    assert "docs/contributing.md" in paragraph and "CHECKLIST" in paragraph, paragraph
    assert not re.search(r"\b(\d+|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve) (files|items)\b",
                         paragraph), paragraph
