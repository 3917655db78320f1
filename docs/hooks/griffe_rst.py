"""Griffe extension for the API reference: otfed's docstrings are written in reStructuredText, the site in Markdown.

mkdocstrings renders a docstring as Markdown. Four reStructuredText constructs of otfed's docstrings would come
out wrong, so this extension rewrites them in every docstring before rendering (the source files are untouched):

* roles — ``:func:`~otfed.ot.wasserstein```, ``:class:`FedWaDConfig```, ``:mod:`.messages``` — become
  cross-references (``<autoref … optional>``): a link where the target is documented on the site, plain code
  where it is not (``optional``: an unresolved target is not a warning, so ``mkdocs build --strict`` passes);
* simple tables (rows between ``=====  ====`` borders) become Markdown tables;
* doctest blocks (``>>>`` lines and their output) become ``pycon`` code blocks instead of nested quotes;
* ``Parameters:`` / ``Returns:`` / ``Raises:`` sections (an indented block of ``name: description`` entries under
  the heading) become a bold heading and a list, ``name`` as code, instead of preformatted text;
* indented blocks that are not list continuations (Algorithm 1's steps, an equation set off by indentation)
  become preformatted text instead of being run into the preceding paragraph;
* TeX-style scripts — ``ξ^{k−1}``, ``η_{P_i}``, ``Σ^{1/2}``, ``ξ^K`` — become superscripts and subscripts
  (``<sup>`` / ``<sub>``) in prose and plain text in preformatted blocks (Unicode scripts where every character
  has one, ``ξ^(k−1)`` otherwise), never raw braces; code spans and doctests are left as they are.

Loaded by ``mkdocs.yml`` (``plugins.mkdocstrings.handlers.python.options.extensions``).
"""
from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const):`(?P<target>[^`]+)`(?:\\ )?")
SPLIT_ROLE = re.compile(r"(:(?:py:)?[a-z]+:`[^`\n]*)\n\s*([^`\n]*`)")
TITLED = re.compile(r"^(?P<title>.+?)\s*<(?P<target>[^<>]+)>$")  # :func:`title <target>`
BORDER = re.compile(r"^\s*=+(?:\s+=+)+\s*$")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s")
FENCE = "```"
SECTIONS = {"Parameters:", "Returns:", "Raises:", "Yields:", "Attributes:", "Other Parameters:"}
ENTRY = re.compile(r"^(?P<names>[*\w]+(?:\s*,\s*[*\w]+)*)(?:\s*\([^()]*\))?:\s+(?P<text>.*)$")  # x_mu, x_nu: text


class RstToMarkdown(griffe.Extension):
    """Rewrite every docstring's reStructuredText constructs into Markdown (see the module docstring)."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value, obj)


def rst_to_markdown(text: str, obj: griffe.Object | None = None) -> str:
    """The Markdown form of one docstring (``obj`` resolves the roles' short names)."""
    text = SPLIT_ROLE.sub(lambda m: m[1] + " " + m[2], text)  # a role broken over two lines: one line
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(FENCE):  # an existing fence: copy it through unchanged
            j = i + 1
            while j < len(lines) and not lines[j].lstrip().startswith(FENCE):
                j += 1
            out.extend(lines[i:j + 1])
            i = j + 1
            continue
        if line.lstrip().startswith(">>>"):
            j = i
            while j < len(lines) and lines[j].strip():
                j += 1
            indent = len(line) - len(line.lstrip())
            out.extend(_block("pycon", [l[indent:] for l in lines[i:j]], out))
            i = j
            continue
        if BORDER.match(line):
            table, i = _table(lines, i, obj)
            out.extend(_separated(table, out))
            continue
        if line.strip() in SECTIONS and not _indented(line) and i + 1 < len(lines) and _indented(lines[i + 1]):
            j = i + 1
            while j < len(lines) and (_indented(lines[j]) or (not lines[j].strip() and j + 1 < len(lines)
                                                                and _indented(lines[j + 1]))):
                j += 1
            out.extend(_separated(_section(line.strip()[:-1], lines[i + 1:j], obj), out))
            i = j
            continue
        if _indented(line) and not _in_list(out) and not line.lstrip().startswith("- "):
            j = i
            while j < len(lines) and (_indented(lines[j]) or (not lines[j].strip() and j + 1 < len(lines)
                                                                and _indented(lines[j + 1]))):
                j += 1
            block = lines[i:j]
            indent = min(len(l) - len(l.lstrip()) for l in block if l.strip())
            out.extend(_block("text", [plain_maths(_plain_roles(l[indent:])) for l in block], out))
            i = j
            continue
        out.append(_roles(line, obj))
        i += 1
    return "\n".join(out)


def _indented(line: str) -> bool:
    return line.startswith("  ") and bool(line.strip())


def _in_list(out: list[str]) -> bool:
    """Whether the previous non-blank output line belongs to a list item (its continuation lines are indented)."""
    for line in reversed(out):
        if not line.strip():
            return False
        if LIST_ITEM.match(line):
            return True
        if not line.startswith(" "):
            return False
    return False


def _separated(block: list[str], out: list[str]) -> list[str]:
    """``block`` with a blank line before it (Markdown needs one to start a table or a fence) and after it."""
    return ([""] if out and out[-1].strip() else []) + block + [""]


def _block(language: str, body: list[str], out: list[str]) -> list[str]:
    return _separated([FENCE + language, *body, FENCE], out)


def _section(title: str, body: list[str], obj: griffe.Object | None) -> list[str]:
    """A ``Parameters:``-style section: its entries (lines at the block's own indent start one, deeper lines
    continue it) as a Markdown list under a bold heading; ``name: text`` entries show ``name`` as code. A
    ``Returns:`` / ``Yields:`` section is one paragraph."""
    if title in ("Returns", "Yields"):  # one description, however its lines wrap
        return [f"**{title}**", "", _roles(" ".join(line.strip() for line in body if line.strip()), obj)]
    indent = min(len(l) - len(l.lstrip()) for l in body if l.strip())
    entries: list[str] = []
    for line in body:
        if not line.strip():
            continue
        if len(line) - len(line.lstrip()) == indent or not entries:
            entries.append(line.strip())
        else:
            entries[-1] += " " + line.strip()
    items = []
    for entry in entries:
        match = ENTRY.match(entry)
        text = f"`{match['names']}`: {match['text']}" if match else entry
        items.append("- " + _roles(text, obj))
    return [f"**{title}**", "", *items]


def _table(lines: list[str], start: int, obj: griffe.Object | None) -> tuple[list[str], int]:
    """A reStructuredText simple table starting at its top border ``lines[start]``, as Markdown table lines,
    and the index of the line after its bottom border. A row whose first cell is blank continues the row above."""
    border = lines[start]
    starts = [m.start() for m in re.finditer(r"=+", border)]
    rows: list[list[str]] = []
    header: list[str] | None = None
    borders = 1
    i = start + 1
    while i < len(lines) and borders < 3:
        line = lines[i]
        i += 1
        if BORDER.match(line):
            borders += 1
            if borders == 2:
                header = [" ".join(cells) for cells in zip(*rows)] if rows else None
                rows = []
            continue
        if not line.strip():
            continue
        cells = [line[a:b].strip() for a, b in zip(starts, starts[1:] + [None])]
        if rows and not cells[0]:
            rows[-1] = [f"{old} {new}".strip() for old, new in zip(rows[-1], cells)]
        else:
            rows.append(cells)
    if header is None:  # a table without a header row: its first row is the header
        header, rows = rows[0], rows[1:]

    def row(cells: list[str]) -> str:
        return "| " + " | ".join(_roles(c, obj).replace("|", "\\|") for c in cells) + " |"

    return [row(header), "| " + " | ".join("---" for _ in header) + " |", *map(row, rows)], i


SCRIPT = re.compile(r"[\^_]\{")                                   # ^{ or _{ : a TeX group follows
BARE_SUP = re.compile(r"(?<=[^\s^_])\^(\((?:[^()]*)\)|[−\-]?[0-9A-Za-zα-ωΑ-Ω]+)")  # ξ^K, M^r, γ^(0), n^−1
CODE_SPAN = re.compile(r"(``.*?``|`[^`]*`|<code>.*?</code>)")
ANGLE = re.compile(r"<(?!/?(?:sup|sub|code|autoref)\b)([^\s<>][^<>\n]*)>")  # ⟨f, a⟩ or a <placeholder>, not a tag
SUPERSCRIPTS = dict(zip("0123456789+−-=()nikKTrpdtsjx", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁻⁼⁽⁾ⁿⁱᵏᴷᵀʳᵖᵈᵗˢʲˣ"))
SUBSCRIPTS = dict(zip("0123456789+−-=()aeoxhklmnpstij", "₀₁₂₃₄₅₆₇₈₉₊₋₋₌₍₎ₐₑₒₓₕₖₗₘₙₚₛₜᵢⱼ"))


def _groups(text: str, wrap) -> str:
    """``text`` with every ``^{…}`` / ``_{…}`` group (braces balanced, nested groups first) replaced by
    ``wrap(kind, content)``, kind ``"^"`` or ``"_"``; an unbalanced group is left as it is."""
    out, i = [], 0
    while True:
        match = SCRIPT.search(text, i)
        if match is None:
            out.append(text[i:])
            return "".join(out)
        depth, j = 1, match.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth:  # unbalanced: leave the rest
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:match.start()])
        out.append(wrap(match.group()[0], _groups(text[match.end():j - 1], wrap)))
        i = j


def html_maths(text: str) -> str:
    """Prose: TeX-style scripts as ``<sup>`` / ``<sub>`` (``ξ^{k−1}`` → ξ<sup>k−1</sup>, ``ξ^K`` → ξ<sup>K</sup>),
    ``<f, a>`` as ⟨f, a⟩ and any other ``<word>`` escaped, all outside code spans."""
    def convert(part: str) -> str:
        # angle brackets in prose are maths (⟨f, a⟩, an inner product) or a placeholder (<client>.json): as raw
        # HTML either would vanish into an unknown tag
        part = ANGLE.sub(lambda m: f"⟨{m[1]}⟩" if "," in m[1] else f"&lt;{m[1]}&gt;", part)
        part = _groups(part, lambda kind, body: f"<{'sup' if kind == '^' else 'sub'}>{body}</{'sup' if kind == '^' else 'sub'}>")
        return BARE_SUP.sub(lambda m: f"<sup>{m[1]}</sup>", part)
    return "".join(part if CODE_SPAN.fullmatch(part) else convert(part) for part in CODE_SPAN.split(text))


def plain_maths(text: str) -> str:
    """Preformatted text: ``^{…}`` / ``_{…}`` as Unicode scripts where every character has one (``Σ^{1/2}`` has
    none for ``/``: ``Σ^(1/2)``), else in parentheses — no braces left."""
    def wrap(kind: str, body: str) -> str:
        table = SUPERSCRIPTS if kind == "^" else SUBSCRIPTS
        if body and all(c in table for c in body):
            return "".join(table[c] for c in body)
        return f"{kind}{body}" if len(body) == 1 else f"{kind}({body})"
    return _groups(text, wrap)


def _roles(line: str, obj: griffe.Object | None) -> str:
    """Every role of ``line`` as an optional cross-reference (code text linked where the target is documented);
    TeX-style scripts outside code as superscripts and subscripts (:func:`html_maths`)."""
    line = html_maths(line)

    def replace(match: re.Match) -> str:
        target = match["target"].strip()
        titled = TITLED.match(target)
        if titled:
            shown, target = titled["title"], titled["target"].strip()
        else:
            short = target.startswith("~")
            target = target.lstrip("~")
            shown = target.lstrip(".").rsplit(".", 1)[-1] if short else target.lstrip(".")
        shown = shown.removesuffix("()")
        return (f'<autoref identifier="{_identifier(target.removesuffix("()"), obj)}" optional>'
                f"<code>{shown}</code></autoref>")
    return ROLE.sub(replace, line)


def _plain_roles(line: str) -> str:
    """Roles inside preformatted text: just the target's name."""
    def replace(match: re.Match) -> str:
        titled = TITLED.match(match["target"].strip())
        return titled["title"] if titled else match["target"].strip().lstrip("~")
    return ROLE.sub(replace, line)


def _identifier(target: str, obj: griffe.Object | None) -> str:
    """The full dotted path a role's target most likely names, seen from ``obj``'s module."""
    if obj is None or target.startswith("otfed."):
        return target
    module = obj if isinstance(obj, griffe.Module) else obj.module
    if target.startswith("."):  # relative to the package (a package's own docstring) or the module's package
        package = module if module.is_init_module else module.parent
        return f"{package.path}{target}" if package is not None else target.lstrip(".")
    head = target.split(".", 1)[0]
    try:
        resolved = obj.resolve(head)
    except Exception:  # noqa: BLE001 — an unknown name: guess the module's own namespace
        resolved = f"{module.path}.{head}"
    return resolved + target[len(head):]
