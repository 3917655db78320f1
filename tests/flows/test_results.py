"""The results page (``flows.results``): offline, every paper section, figures that exist, missing stages named."""
from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from flows import results
from flows.paper_numbers import PAPERS
from stages.params import stages

REPO = Path(__file__).resolve().parents[2]


class Links(HTMLParser):
    """Every tag with a src / href, and whether any script or stylesheet appears."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self.tags: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in {"src", "href"} and value is not None:
                self.refs.append((tag, name, value))
            if name == "id" and value:
                self.ids.add(value)


def parse(page: str) -> Links:
    links = Links()
    links.feed(page)
    return links


def assert_offline(page: str, out_dir: Path) -> Links:
    links = parse(page)
    assert "script" not in links.tags and "link" not in links.tags and "iframe" not in links.tags
    for tag, _, value in links.refs:
        assert not value.startswith(("http://", "https://", "//")), (tag, value)
    for tag, attr, value in links.refs:
        if tag == "img":
            assert (out_dir / value).is_file(), f"{value} (relative to {out_dir}) does not exist"
        elif value.startswith("#"):
            assert value[1:] in links.ids, f"anchor {value} has no target"
    return links


def png(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    plt.imsave(path, np.zeros((2, 2)))


@pytest.fixture
def fake_reports(tmp_path: Path) -> Path:
    """A tiny reports tree: fed_distance (a clustering table, one figure, metrics), removal (its table, no
    figure), valuation (a table with the wrong columns); every other stage not run."""
    root = tmp_path / "reports"
    fd = root / "fed_distance"
    fd.mkdir(parents=True)
    pd.DataFrame({"federation": ["pairs_strong", "pairs_strong", "pairs_none", "pairs_none"],
                  "method": ["affinity", "knn3", "affinity", "knn3"], "n_neighbors": [0, 3, 0, 3],
                  "ari": [1.0, 0.9, 0.25, 0.125], "n_clusters_found": [5, 5, 5, 5]}).to_csv(fd / "clustering_ari.csv",
                                                                                         index=False)
    png(fd / "clustering_pairs_strong.png")
    (fd / "metrics.json").write_text(json.dumps({
        "clustering": {"pairs_strong": {"affinity": 1.0}, "pairs_none": {"affinity": 0.25}},
        "toy": {"seconds_exact_ot_total": 41.0}}))
    # the toy table as the stage commits it: no wall-time column (TrackedReport.table drops it)
    toy = [("exact_ot", 0, 0.0), ("fedwad_approx", 2, 0.25), ("fedwad_approx", 10, 0.0625),
           ("fedwad_exact_interp", 40, 0.001953125)]
    pd.DataFrame([dict(dim=2, ratio=1, n=n, repeat=0, method=m, support=s if m != "fedwad_exact_interp" else n,
                       rel_error=e * n / 40) for n in (20, 40) for m, s, e in toy]).to_csv(fd / "toy_gaussians.csv",
                                                                                          index=False)
    rm = root / "removal"
    rm.mkdir()
    summary = {"federation": ["fmnist_label_noise"], "seeds": [3], "noisy": [200]}
    for col, value in (("removed_flagged", 790), ("removed_budget", 100), ("auc", 0.81), ("accuracy_before", 0.726),
                       ("accuracy_flagged", 0.712), ("accuracy_budget", 0.72), ("accuracy_oracle_removal", 0.728),
                       ("gain_budget", -0.006), ("gain_oracle_removal", 0.002)):
        summary[col], summary[f"{col}_ci95"] = [value], [0.01]
    pd.DataFrame(summary).to_csv(rm / "removal_summary.csv", index=False)
    va = root / "valuation"
    va.mkdir()
    pd.DataFrame({"unexpected": [1]}).to_csv(va / "detection.csv", index=False)
    return root


def test_fake_tree_page(fake_reports: Path) -> None:
    out = fake_reports / "index.html"
    page = results.page_html(fake_reports, out)
    links = assert_offline(page, out.parent)
    for paper in PAPERS:  # every paper and every item has its section
        assert paper["key"] in links.ids and paper["title"] in page.replace("&#x27;", "'")
        for i, _ in enumerate(paper["items"]):
            assert f'{paper["key"]}-{i}' in links.ids
    # what ran: the table (ARI 0.125 formatted), the figure, the headline metrics (no wall time)
    assert "0.125" in page and 'src="fed_distance/clustering_pairs_strong.png"' in page
    # the toy views read a table without wall times: relative errors at n = 40 (the largest n), 0.25 for S = 2
    assert "relative error |est − W| / W at n = 40" in page and "relative error at n = 40, ratio 1:1" in page
    assert "<td>0.25</td>" in page and "0.001953" in page
    assert "not run yet (python -m bench.fedwad_speed)" in page  # FedWaD's timings: the benchmark's table
    assert "clustering.pairs_strong.affinity" in page and "seconds_exact_ot_total" not in page
    # what did not: a stage never run, a missing figure, a missing table
    for stage in ("train_teachers", "estimate_bias", "distill", "partition"):
        assert f"not run yet (dvc repro {stage})" in page
    assert "clustering_pairs_none.png missing: not run yet (dvc repro fed_distance)" in page
    assert "otdd_pairs.csv missing: not run yet (dvc repro fed_distance)" in page
    assert "removal.png missing" in page and "0.712" in page
    assert "not run yet (python -m bench.fedbary_scaling)" in page
    # a table whose columns changed: said on the page, the rest still built
    assert "could not read this table" in page
    # the paper's numbers are there even when otfed's are not
    assert "26.3 ± 3.8" in page and "0.41" in page


def test_page_is_deterministic_and_main_writes_it(fake_reports: Path, tmp_path: Path) -> None:
    out = tmp_path / "site" / "page.html"
    assert results.main(["--reports", str(fake_reports), "--out", str(out)]) == 0
    first = out.read_text()
    assert results.main(["--reports", str(fake_reports), "--out", str(out)]) == 0
    assert out.read_text() == first
    assert_offline(first, out.parent)  # images relative to the page's own folder
    assert not list(out.parent.glob("*.tmp"))
    assert results.main(["--reports", str(tmp_path / "nowhere")]) == 2


def test_page_depends_on_the_reports_only(fake_reports: Path, tmp_path: Path) -> None:
    """The committed page is byte-reproducible: the same reports copied elsewhere (another clone, another
    machine) give the same bytes — no absolute path, commit, date or time in it."""
    elsewhere = tmp_path / "clone" / "deeper" / "reports"
    shutil.copytree(fake_reports, elsewhere)
    here = results.write_page(fake_reports).read_bytes()
    there = results.write_page(elsewhere).read_bytes()
    assert here == there
    page = here.decode()
    assert str(tmp_path) not in page and "/home/" not in page
    assert not re.search(r"\b[0-9a-f]{40}\b", page)  # no commit sha
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b|\b\d\d:\d\d:\d\d\b", page)  # no date, no time of day


def test_empty_tree_says_not_run_for_every_stage(tmp_path: Path) -> None:
    root = tmp_path / "reports"
    root.mkdir()
    page = results.page_html(root, root / "index.html")
    assert_offline(page, root)
    for name in stages():
        assert f"not run yet (dvc repro {name})" in page
    assert "<img" not in page


def test_committed_reports_page(tmp_path: Path) -> None:
    reports = REPO / "reports"
    if not (reports / "fed_distance" / "metrics.json").exists():
        pytest.skip("no committed reports")
    out = reports / "index.html"  # built in memory only: the test writes nothing under reports/
    page = results.page_html(reports, out)
    links = assert_offline(page, out.parent)
    assert "could not read this table" not in page, "a view no longer matches the committed tables"
    assert "not run yet" not in page.replace("not run yet (python -m bench", "")
    imgs = [v for t, _, v in links.refs if t == "img"]
    assert len(imgs) >= 18
    for name, stage in stages().items():  # every stage's headline metrics are on the page
        folder = Path(stage.outputs[0]).name
        assert f"<code>{folder}/metrics.json</code>" in page, name
    for paper in PAPERS:
        assert paper["key"] in links.ids
    # the page references the PNGs in place (small page, no embedded images)
    assert "data:image" not in page and len(page.encode()) < 500_000
    # nothing of this checkout or this moment: no absolute path, no commit sha
    assert str(REPO) not in page and not re.search(r"\b[0-9a-f]{40}\b", page)


def test_every_view_named_by_the_papers_exists() -> None:
    named = {v for paper in PAPERS for item in paper["items"] for v in item.get("views", [])}
    assert named <= set(results.VIEWS), named - set(results.VIEWS)
    for paper in PAPERS:
        for item in paper["items"]:
            assert item["stage"] in stages() or item.get("run"), item["ref"]


def test_the_committed_page_is_the_page_of_the_committed_reports() -> None:
    """`make pipeline` rewrites reports/index.html after `dvc repro`: a page committed stale (reports regenerated
    without it) would leave a fresh clone's tree modified. It must be what the committed reports give now."""
    committed = REPO / "reports" / "index.html"
    assert results.page_html(REPO / "reports", committed) == committed.read_text(encoding="utf-8"), (
        "reports/index.html is stale: run `python -m flows.results` and commit it")
