"""CITATION.cff: valid YAML in Citation File Format 1.2.0, otfed at its own version, and a reference for every
paper the results page quotes (flows/paper_numbers.py) — by name, title words and, where the page gives one,
venue and year."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

import otfed
from flows.paper_numbers import PAPERS

REPO = Path(__file__).resolve().parent.parent


def citation() -> dict:
    return yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))


def words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def test_citation_is_cff_1_2_0_for_otfed_at_its_version() -> None:
    cff = citation()
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert cff["version"] == otfed.__version__
    assert "otfed" in cff["title"] and cff["license"] == "MIT"
    for key in ("message", "authors", "references"):
        assert cff[key], key
    for ref in cff["references"]:
        assert ref["title"] and ref["authors"] and ref["type"], ref


@pytest.mark.parametrize("paper", PAPERS, ids=lambda p: p["key"])
def test_every_quoted_paper_is_referenced(paper: dict) -> None:
    """A page title reads ``NAME — Title[ / Other title][ (VENUE YEAR)]``: NAME is a reference's abbreviation,
    each title's words are all in one reference's title, and VENUE / YEAR are that reference's."""
    name, _, rest = paper["title"].partition(" — ")
    venue = re.search(r"\s*\((\w+) (\d{4})\)$", rest)
    titles = rest[:venue.start()] if venue else rest
    refs = citation()["references"]
    assert name in {r.get("abbreviation") for r in refs}, f"no reference abbreviated {name!r}"
    for title in titles.split(" / "):
        matches = [r for r in refs if words(title) <= words(r["title"])]
        assert matches, f"no reference titled like {title!r}"
        if venue:
            assert any(venue[1] in r.get("conference", {}).get("name", "") and r.get("year") == int(venue[2])
                       for r in matches), f"{title!r}: no reference at {venue[1]} {venue[2]}"
