"""The API reference shows what a user must set (issue #34): every config type's fields, defaults and allowed values
appear on its API page, and no TeX leaks into the rendered maths.

``docs/hooks/griffe_configs.py`` appends a Fields table, generated from each pydantic model's ``model_fields``,
to its docstring; ``docs/hooks/griffe_rst.py`` turns TeX-style scripts (``ξ^{k−1}``, ``η_{P_i}``) into
superscripts / subscripts and inner products ``<f, a>`` into ⟨f, a⟩. The slow test builds the API pages alone
(offline, the real ``mkdocs.yml`` with the reports hook and the other pages left out) and reads the HTML; the
truth it checks against is each model's own ``model_fields``, walked over every config type in ``otfed``
(every subclass of :class:`otfed.schema.Strict`), not a list kept by hand.
"""
from __future__ import annotations

import html
import importlib
import importlib.util
import os
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import annotated_types
import pytest
import yaml
from pydantic_core import PydanticUndefined

import otfed
from otfed.schema import Strict
from tests.ceilings import ceiling, hit, tail

REPO = Path(__file__).resolve().parent.parent
API = REPO / "docs" / "api"
BOUNDS = {annotated_types.Ge: ("ge", "≥"), annotated_types.Gt: ("gt", ">"), annotated_types.Le: ("le", "≤"),
          annotated_types.Lt: ("lt", "<")}
TEX = re.compile(r"\^\{|_\{|\\(?:frac|sum|sqrt|mathbb|mathcal|langle|rangle|cdot|le|ge)\b")
# what the HTML of the API pages may contain as tags: the theme's and mkdocstrings' own, nothing from a docstring's
# "<f, a>" or "<client>" (a browser hides an unknown tag and its text with it)
KNOWN_TAGS = {"a", "article", "body", "button", "code", "div", "em", "footer", "form", "h1", "h2", "h3", "h4", "h5",
              "h6", "head", "header", "html", "input", "label", "li", "link", "main", "meta", "nav", "ol", "p", "path",
              "pre", "script", "small", "span", "strong", "sub", "sup", "svg", "table", "tbody", "td", "th", "thead",
              "title", "tr", "ul", "br", "hr", "img", "details", "summary", "blockquote", "autoref"}


def config_types() -> list[type[Strict]]:
    """Every public config type otfed defines: the subclasses of Strict in its modules."""
    for module in pkgutil.walk_packages(otfed.__path__, "otfed."):
        importlib.import_module(module.name)
    found, stack = set(), [Strict]
    while stack:
        for sub in stack.pop().__subclasses__():
            stack.append(sub)
            if sub.__module__.startswith("otfed.") and not sub.__name__.startswith("_"):
                found.add(sub)
    return sorted(found, key=lambda c: (c.__module__, c.__name__))


def _expected_cells(info) -> list[str]:
    """What the row of a field must show, from pydantic's FieldInfo: the default's repr and each bound."""
    cells = []
    if info.default is not PydanticUndefined:
        cells.append(repr(info.default))
    for constraint in info.metadata:
        for kind, (attribute, symbol) in BOUNDS.items():
            if isinstance(constraint, kind):
                cells.append(f"{symbol} {getattr(constraint, attribute)!r}")
    return cells


def test_every_config_type_is_on_an_api_page() -> None:
    documented = " ".join(page.read_text(encoding="utf-8") for page in API.glob("*.md"))
    missing = [f"{c.__module__}.{c.__name__}" for c in config_types()
               if f"::: {c.__module__}.{c.__name__}" not in documented and f"::: {c.__module__}\n" not in documented]
    assert not missing, f"config types without an API entry (docs/api/*.md): {missing}"


def test_the_fedwad_fields_the_issue_names_are_in_the_generated_table() -> None:
    sys.path.insert(0, str(REPO / "docs" / "hooks"))
    try:
        from griffe_configs import fields_table
    finally:
        sys.path.remove(str(REPO / "docs" / "hooks"))
    from otfed.federation.fedwad import FedWaDConfig

    rows = {line.split("|")[1].strip(): line for line in fields_table(FedWaDConfig) if line.startswith("| `")}
    assert set(rows) == {f"`{name}`" for name in FedWaDConfig.model_fields}
    assert "`10`" in rows["`support_size`"] and "≥ 1" in rows["`support_size`"] and "≤ 20000" in rows["`support_size`"]
    assert "`1.0`" in rows["`init_scale`"] and "> 0.0" in rows["`init_scale`"]


def _build_api_pages(tmp_path: Path) -> Path:
    """The API pages built alone with the real mkdocs.yml's theme, plugins and extensions; returns the site."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    docs = tmp_path / "docs"
    shutil.copytree(API, docs / "api")
    (docs / "index.md").write_text("# otfed\n", encoding="utf-8")
    handler = config["plugins"][1]["mkdocstrings"]["handlers"]["python"]
    handler["paths"] = [str(REPO)]
    handler["options"]["extensions"] = [str(REPO / e) for e in handler["options"]["extensions"]]
    nav = next(item["API reference"] for item in config["nav"] if isinstance(item, dict) and "API reference" in item)
    config.update(docs_dir=str(docs), nav=[{"Home": "index.md"}, {"API reference": nav}], hooks=[], watch=[],
                  strict=False, validation={"omitted_files": "info", "absolute_links": "info",
                                             "unrecognized_links": "info", "anchors": "info",
                                             "links": {"not_found": "info"}})
    config.pop("exclude_docs", None)
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    site = tmp_path / "site"
    dead = "http://127.0.0.1:9"  # nothing listens there: any download attempt fails the build
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "http_proxy": dead,
           "https_proxy": dead, "NO_PROXY": "", "no_proxy": ""}
    command = [sys.executable, "-m", "mkdocs", "build", "-f", str(tmp_path / "mkdocs.yml"), "--site-dir", str(site)]
    try:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=ceiling(300))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(hit("mkdocs build of the API pages", 300, tail(exc.stdout, exc.stderr)))
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"mkdocs build failed (exit {done.returncode}):\n{tail(log, lines=60)}"
    assert not re.search(r"^ERROR\b", log, re.MULTILINE), tail(log, lines=60)
    return site


def _prose(page_html: str) -> str:
    """The text a reader sees outside code: inline code spans and doctest blocks (``>>>`` prompts) dropped, the
    preformatted text blocks (equations, Algorithm 1's steps) kept."""
    text = re.sub(r"<pre>(?:(?!</pre>).)*class=\"gp\"(?:(?!</pre>).)*</pre>", " ", page_html, flags=re.S)
    text = re.sub(r"(?<!<span></span>)<code(?: [^>]*)?>.*?</code>", " ", text, flags=re.S)
    text = re.sub(r"<script.*?</script>", " ", text, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", text))


@pytest.mark.slow  # an mkdocs build of the API pages in a subprocess
def test_api_pages_show_every_config_field_and_no_tex(tmp_path: Path) -> None:
    if any(importlib.util.find_spec(name) is None for name in ("mkdocs", "material", "mkdocstrings")):
        pytest.skip("the docs toolchain is not installed (pip install -r requirements.lock)")
    site = _build_api_pages(tmp_path)
    pages = {page.name: page.read_text(encoding="utf-8") for page in (site / "api").glob("*.html")}

    problems = []
    for model in config_types():
        anchor = f'id="{model.__module__}.{model.__name__}"'
        page = next((text for text in pages.values() if anchor in text), None)
        if page is None:
            problems.append(f"{model.__name__}: no entry on any API page")
            continue
        entry = page[page.index(anchor):]
        table = entry[entry.find("<strong>Fields</strong>"):]
        table = table[:table.find("</table>")]
        if "<strong>Fields</strong>" not in entry or not table:
            problems.append(f"{model.__name__}: no Fields table")
            continue
        rows = {html.unescape(re.sub(r"<[^>]+>", "", m[1])): html.unescape(re.sub(r"<[^>]+>", " ", m[0]))
                for m in re.finditer(r"<tr>\s*<td><code>([^<]+)</code></td>.*?</tr>", table, re.S)}
        for name, info in model.model_fields.items():
            if name not in rows:
                problems.append(f"{model.__name__}.{name}: not in its Fields table")
                continue
            problems += [f"{model.__name__}.{name}: {cell!r} missing from its row" for cell in _expected_cells(info)
                         if cell not in rows[name]]
    assert not problems, "\n".join(problems)

    leaks = {name: TEX.findall(_prose(text)) for name, text in pages.items()}
    assert not any(leaks.values()), f"TeX left in the API pages: { {k: v[:5] for k, v in leaks.items() if v} }"
    unknown = {name: sorted({t for t in re.findall(r"<([A-Za-z][^\s>/]*)", text)} - KNOWN_TAGS)
               for name, text in pages.items()}
    assert not any(unknown.values()), f"angle brackets rendered as unknown HTML tags (hidden text): {unknown}"
