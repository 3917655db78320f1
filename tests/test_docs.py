"""The documentation site (``mkdocs.yml``, ``docs/``): it builds offline with warnings as errors, its quickstarts run,
its links resolve, and what it copies from the results page and the reports is still what they say.

* the build: ``python -m mkdocs build --strict`` into a temporary folder, with every proxy variable pointing at a
  closed port (a build that reached for the network would fail), then no page may load a script, a stylesheet or
  a font from another host;
* ``docs/getting-started.md``: every ```` ```python ```` block runs, as it is, in a fresh interpreter from the
  repository root;
* every relative link and image of ``docs/`` points to an existing file (``../reports/…`` included);
* ``README.md``'s ```` ```python ```` blocks (its quickstarts) run the same way;
* every quotation attributed to a report or to another file (a ``>`` block ending in ``> — <source>``) is in that
  file word for word (whitespace aside), and every row of a claims table (``| paper item | the paper's claim |
  verdict | report |``) has the verdict that ``docs/results.md``'s claims table gives that claim — so a
  regenerated report or a changed verdict fails here until the docs say the new one (``tests/test_readme.py``
  checks that the results page's numbers are the reports').
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ceilings import ceiling, hit, tail

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
GETTING_STARTED = DOCS / "getting-started.md"
README = REPO / "README.md"
RESULTS = DOCS / "results.md"   # the claims table, with the numbers (tests/test_readme.py checks them)

FENCE = re.compile(r"^```.*?^```[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
ATTRIBUTION = re.compile(r"^—\s*\[?`(?P<source>[^`]+)`")
CLAIMS_HEADER = "| paper item | the paper's claim | verdict | report |"


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python[ \t]*\n(.*?)^```[ \t]*$", markdown, re.MULTILINE | re.DOTALL)


def _normal(text: str) -> str:
    return " ".join(text.split())


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split(" | ")]


# ---------------------------------------------------------------------------------------------------- the build


def _missing_packages() -> list[str]:
    missing = []
    for name in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # the parent package of a dotted name is missing
            found = False
        if not found:
            missing.append(name)
    return missing


@pytest.mark.slow  # a whole mkdocs build in a subprocess
def test_site_builds_strict_and_offline(tmp_path: Path) -> None:
    missing = _missing_packages()
    if missing:
        pytest.skip(f"the docs toolchain is not installed in {sys.executable} (missing: {', '.join(missing)}; "
                    f"pip install -r requirements.lock)")
    site = tmp_path / "site"
    dead = "http://127.0.0.1:9"  # nothing listens there: any download attempt fails the build
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "http_proxy": dead,
           "https_proxy": dead, "ALL_PROXY": dead, "NO_PROXY": "", "no_proxy": ""}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    try:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=ceiling(300))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(hit("mkdocs build --strict", 300, tail(exc.stdout, exc.stderr)))
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"mkdocs build --strict failed (exit {done.returncode}):\n{tail(log, lines=60)}"
    assert not re.search(r"^(WARNING|ERROR)\b", log, re.MULTILINE), tail(log, lines=60)

    for page in ("index.html", "getting-started.html", "papers/fedwad.html", "privacy.html", "pipeline.html",
                 "api/federation.html", "reports/index.html", "reports/fed_distance/privacy_attack.html",
                 "reports/fed_distance/privacy.png"):
        assert (site / page).is_file(), f"the site lacks {page}"
    api = (site / "api" / "federation.html").read_text(encoding="utf-8")
    for anchor in ("otfed.federation.fedwad.federated_wasserstein", "otfed.federation.fedbary.federated_valuation",
                   "otfed.federation.fedwad.FedWaDResult"):
        assert f'id="{anchor}"' in api, f"the API reference does not document {anchor}"
    assert ":func:" not in api and ":class:" not in api, "reStructuredText roles left unconverted in the API pages"
    # Parameters / Returns sections render as lists with the names as code (docs/hooks/griffe_rst.py), not as
    # preformatted text
    assert "<strong>Parameters</strong>" in api and "<li><code>x_mu, x_nu</code>:" in api, \
        "federated_wasserstein's Parameters section is not rendered as a list"
    fedwad_page = (site / "papers" / "fedwad.html").read_text(encoding="utf-8")
    assert 'href="../reports/fed_distance/toy_gaussians.html"' in fedwad_page, "report links not rewritten"

    external = re.compile(r"<(?:script|img|iframe)[^>]*\ssrc=\"(?:https?:)?//|<link[^>]*\shref=\"(?:https?:)?//"
                          r"|@import\s+url\((?:https?:)?//|fonts\.(?:googleapis|gstatic)\.com")
    offenders = [str(path.relative_to(site)) for path in site.rglob("*")
                 if path.suffix in {".html", ".css", ".js"} and external.search(path.read_text(encoding="utf-8",
                                                                                            errors="replace"))]
    assert not offenders, f"pages that load something from another host: {offenders[:10]}"


# ---------------------------------------------------------------------------------------------- the quickstarts


SNIPPETS = _python_blocks(GETTING_STARTED.read_text(encoding="utf-8"))
README_SNIPPETS = _python_blocks(README.read_text(encoding="utf-8"))


def test_getting_started_has_the_three_quickstarts() -> None:
    assert len(SNIPPETS) >= 3, (f"docs/getting-started.md has {len(SNIPPETS)} python blocks, expected the three "
                                "quickstarts")


def _run_quickstart(code: str, what: str) -> None:
    """``code`` as it is, in a fresh interpreter from the repository root: it must exit 0 and print something."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=ceiling(180))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(hit(what, 180, tail(exc.stdout, exc.stderr)))
    assert done.returncode == 0, f"{what} failed:\n{tail(done.stdout, done.stderr)}"
    assert done.stdout.strip(), f"{what} printed nothing"


@pytest.mark.slow  # each in a fresh interpreter
@pytest.mark.parametrize("index", range(len(SNIPPETS)), ids=lambda i: f"snippet{i + 1}")
def test_getting_started_snippet_runs(index: int) -> None:
    _run_quickstart(SNIPPETS[index], f"quickstart {index + 1} of docs/getting-started.md")


def test_the_readme_has_a_quickstart_per_paper() -> None:
    imports = " ".join(README_SNIPPETS)
    for module in ("otfed.federation.fedwad", "otfed.federation.fedbary", "otfed.distill"):
        assert f"from {module} import" in imports, f"README.md has no quickstart importing {module}"
    assert all(len(block.strip().splitlines()) <= 12 for block in README_SNIPPETS), \
        "a README quickstart is longer than 12 lines: put the long version in docs/getting-started.md"


@pytest.mark.slow  # each in a fresh interpreter
@pytest.mark.parametrize("index", range(len(README_SNIPPETS)), ids=lambda i: f"readme{i + 1}")
def test_readme_quickstart_runs(index: int) -> None:
    _run_quickstart(README_SNIPPETS[index], f"quickstart {index + 1} of README.md")


def test_the_readme_is_a_short_front_door() -> None:
    """Issue #23: the README is at most 250 lines; the measured numbers live in the docs (tests/test_readme.py)."""
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines; move the detail into docs/ (the limit is 250)"


# --------------------------------------------------------------------------------------------------- the links


def test_relative_links_point_to_existing_files() -> None:
    broken = []
    for page in _pages():
        text = INLINE_CODE.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
        for match in LINK.finditer(text):
            target = match["target"].split("#", 1)[0]
            if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
                continue
            if not (page.parent / target).resolve().exists():
                broken.append(f"{page.relative_to(REPO)}: {match['target']}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


# ------------------------------------------------------------------------------------ quotations and verdicts


def _quotes(page: Path) -> list[tuple[str, list[str]]]:
    """(source, quoted units) of every attributed ``>`` block of ``page``: a unit is a table row or a paragraph."""
    quotes, block = [], []
    for line in page.read_text(encoding="utf-8").splitlines() + [""]:
        if line.startswith(">"):
            block.append(line[1:].strip())
            continue
        if block:
            attribution = ATTRIBUTION.match(block[-1])
            if attribution:
                units, paragraph = [], []
                for quoted in block[:-1] + [""]:
                    if quoted.startswith("|"):
                        units.append(quoted)
                    elif quoted:
                        paragraph.append(quoted)
                    if (not quoted or quoted.startswith("|")) and paragraph:
                        units.append(" ".join(paragraph))
                        paragraph = []
                quotes.append((attribution["source"], units))
            block = []
    return quotes


def test_quotations_are_word_for_word() -> None:
    wrong, count = [], 0
    for page in _pages():
        for source, units in _quotes(page):
            path = REPO / source
            assert path.is_file(), f"{page.relative_to(REPO)} quotes {source}, which does not exist"
            original = _normal(path.read_text(encoding="utf-8"))
            for unit in units:
                count += 1
                if _normal(unit) not in original:
                    wrong.append(f"{page.relative_to(REPO)} quotes {source}, which no longer says:\n    {unit}")
    assert count, "no attributed quotation found in docs/ (the convention: a > block ending in '> — `source`')"
    assert not wrong, "\n".join(wrong)


def _results_verdicts() -> dict[tuple[str, str], str]:
    verdicts = {}
    for line in RESULTS.read_text(encoding="utf-8").splitlines():
        cells = _cells(line) if line.startswith("| ") else []
        if len(cells) == 4 and cells[0] != "paper item" and not set(cells[0]) <= {"-", " "}:
            verdicts[cells[0], cells[1]] = cells[3]
    return verdicts


def test_claims_tables_copy_the_results_verdicts() -> None:
    results, wrong, rows = _results_verdicts(), [], 0
    assert results, f"{RESULTS.relative_to(REPO)} has no claims table (| paper item | the paper's claim | ... |)"
    for page in _pages():
        if page == RESULTS:
            continue
        lines = page.read_text(encoding="utf-8").splitlines()
        for start, line in enumerate(lines):
            if line.strip() != CLAIMS_HEADER:
                continue
            for row in lines[start + 2:]:
                if not row.startswith("|"):
                    break
                item, claim, verdict, _ = _cells(row)
                rows += 1
                if results.get((item, claim)) != verdict:
                    wrong.append(f"{page.relative_to(REPO)}: {item} — {claim!r}: docs say {verdict!r}, "
                                 f"{RESULTS.relative_to(REPO)} says "
                                 f"{results.get((item, claim), 'nothing (no such claim in its table)')!r}")
    assert rows, f"no claims table ({CLAIMS_HEADER}) found in docs/"
    assert not wrong, "\n".join(wrong)


def test_the_params_files_cite_only_files_in_the_repository() -> None:
    """Every repository path a comment of ``params.yaml`` / ``params-paper.yaml`` cites (``docs/running.md``,
    ``reports/studies/teacher_options.md``) exists: a comment points to what a checkout holds, never to a note
    kept elsewhere."""
    # (data/ but data/raw is what the stages write: not in a fresh checkout)
    roots = ("data/raw", "docs", "reports", "stages", "otfed", "flows", "tests", "bench", "studies", "gpu")
    path = re.compile(rf"\b(?:{'|'.join(roots)})/[\w./-]*[\w/]")
    missing = [f"{name}:{number}: {cited}" for name in ("params.yaml", "params-paper.yaml")
               for number, line in enumerate((REPO / name).read_text(encoding="utf-8").splitlines(), start=1)
               if "#" in line for cited in path.findall(line.split("#", 1)[1])
               if not (REPO / cited).exists()]
    assert not missing, "params files cite files that are not in the repository:\n" + "\n".join(missing)
