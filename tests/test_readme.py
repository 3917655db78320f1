"""The README's and the docs' numbers are the committed reports' numbers (issue #21, item 6: "README true by
construction"; issue #23 moved the measured numbers from the README into the docs pages of :data:`PAGES`).

Every number the README or a page of :data:`PAGES` quotes from ``reports/`` (stage tables, ``metrics.json``,
``dvc.yaml``'s metrics and plots, ``reports/bench/``) is listed below as a :class:`Quote`: a passage with each quoted
number written as a placeholder, and a function that reads the value(s) from the committed report *at test time* —
so a regenerated report with different numbers fails here until the page says the new ones. The page's value is
compared at the page's own rounding: ``0.61`` matches a report value in [0.605, 0.615].

Placeholders in a passage (whitespace and line breaks in the page do not matter):

* ``{}``   a number that must equal the report's value at the page's rounding;
* ``{<=}`` a number that bounds the report's value from above ("≤ 4e-16"), ``{>=}`` from below ("R² ≥ 0.989");
* ``{=}``  a word that must equal the report's (a verdict, a count in words).

A failure names the page and line, the report file, the page's value and the report's value. A passage that is in
none of the pages fails too: reword the page and the quote here together. Not checked here, as no report holds
them: wall-clock timings measured by hand in a session (``took 4m59s``), earlier runs' numbers, the papers' own
numbers and goals, and parameters a page names (``S = 10``) where no report records them.

``python -m tests.test_readme`` prints every quoted number with its report value.
"""
from __future__ import annotations

import bisect
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
README = "README.md"
#: the pages whose quoted numbers are checked, in order: a quote's passage is looked for in each page
PAGES = ("README.md", "docs/running.md", "docs/scaling.md", "docs/results.md", "docs/benchmarks.md",
         "docs/contributing.md")

# a number as the README writes it: 2,000 · −0.73 · +26.8 · 5.4e-4 (a Unicode minus is a minus)
NUMBER = r"[+\-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[+\-−]?\d+)?"
WORD = r"[^\s|]+?"
PLACEHOLDER = re.compile(r"\{(|<=|>=|=)\}")
NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}


# ----------------------------------------------------------------------------------------------------------------
# reading the committed reports


class Reports:
    """The committed results under ``root``, read once per path (tests may replace a table in ``tables``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tables: dict[str, pd.DataFrame] = {}

    def csv(self, path: str) -> pd.DataFrame:
        if path not in self.tables:
            self.tables[path] = pd.read_csv(self.root / path, keep_default_na=False, na_values=["", "nan", "NaN"])
        return self.tables[path]

    def json(self, path: str) -> dict:
        return json.loads((self.root / path).read_text())

    def yaml(self, path: str) -> dict:
        return yaml.safe_load((self.root / path).read_text())

    def row(self, path: str, **where: object) -> pd.Series:
        """The one row of ``path`` whose columns equal ``where``."""
        table = self.csv(path)
        mask = pd.Series(True, index=table.index)
        for column, value in where.items():
            mask &= table[column] == value
        rows = table[mask]
        if len(rows) != 1:
            raise LookupError(f"{path}: {len(rows)} rows where {where} (expected exactly 1)")
        return rows.iloc[0]

    def text(self, path: str) -> str:
        return (self.root / path).read_text()

    def md_tables(self, path: str) -> list[pd.DataFrame]:
        """Every Markdown table of ``path``, cells as written (text)."""
        tables: list[pd.DataFrame] = []
        block: list[list[str]] = []
        for line in self.text(path).splitlines() + [""]:
            if line.startswith("|"):
                block.append([cell.strip() for cell in line.strip().strip("|").split("|")])
            elif block:
                tables.append(pd.DataFrame(block[2:], columns=block[0]))
                block = []
        return tables

    def md_row(self, path: str, having: Sequence[str] = (), **where: str) -> pd.Series:
        """The one row matching ``where`` over the Markdown tables of ``path`` with ``where``'s and ``having``'s
        columns."""
        rows = [row for table in self.md_tables(path) if {*where, *having} <= set(table.columns)
                for _, row in table.iterrows() if all(row[column] == value for column, value in where.items())]
        if len(rows) != 1:
            raise LookupError(f"{path}: {len(rows)} table rows where {where} (expected exactly 1)")
        return rows[0]

    def md_number(self, path: str, pattern: str) -> float:
        """The number captured by ``pattern`` in the text of ``path``."""
        match = re.search(pattern, self.text(path))
        if match is None:
            raise LookupError(f"{path}: no text matching {pattern!r}")
        return float(match.group(1))


def plus_minus(cell: str) -> tuple[float, float]:
    """``"+0.5 ± 0.4"`` → (0.5, 0.4), as a generated Markdown table writes a mean and its 95% CI half-width."""
    mean, ci = cell.split("±")
    return float(mean.replace("−", "-")), float(ci)


def one_value(values: Sequence[float], what: str) -> float:
    """The value all of ``values`` share (a quote says "on every seed"); ValueError when they differ."""
    low, high = min(values), max(values)
    if high - low > 1e-12 * max(1.0, abs(high)):
        raise ValueError(f"{what} differs between {low:.6g} and {high:.6g}")
    return low


def leaves(tree: object) -> int:
    """How many scalar values a nested metrics document holds (what ``dvc metrics show --json`` lists)."""
    if isinstance(tree, dict):
        return sum(leaves(value) for value in tree.values())
    if isinstance(tree, list):
        return sum(leaves(value) for value in tree)
    return 1


# ----------------------------------------------------------------------------------------------------------------
# matching a quote against the README


@dataclass(frozen=True)
class Quote:
    """A README passage quoting numbers from ``source``; ``values`` reads them, in passage order."""

    name: str
    passage: str
    source: str
    values: Callable[[Reports], Sequence[float | str]]

    def slots(self) -> list[str]:
        return PLACEHOLDER.findall(self.passage)

    def pattern(self) -> re.Pattern[str]:
        literals = [re.escape(re.sub(r"\s+", " ", part)) for part in PLACEHOLDER.split(self.passage)[::2]]
        slots = [f"({WORD})" if kind == "=" else f"({NUMBER})" for kind in self.slots()]
        body = literals[0] + "".join(slot + literal for slot, literal in zip(slots, literals[1:]))
        # a number slot at either end must not cut a longer number in two
        return re.compile(r"(?<![\d.,])" * body.startswith("(") + body + r"(?![\d])" * body.endswith(")"))


class Text:
    """Pages (the README and the docs of :data:`PAGES`) with their whitespace runs collapsed to one space, one after
    the other, and the page and line each character came from. No passage can run from one page into the next."""

    def __init__(self, raw: str, name: str = README, more: Sequence[tuple[str, str]] = ()) -> None:
        pieces: list[str] = []
        self.starts: list[int] = []  # offset in the flat text where each raw line starts
        self.lines: list[tuple[str, int, str]] = []  # (page, line number, the raw line) of each raw line
        flat_len = 0
        for page, (page_name, page_raw) in enumerate([(name, raw), *more]):
            if page:  # a separator no passage contains
                pieces.append("\u2029 ")
                flat_len += 2
            for number, line in enumerate(page_raw.split("\n"), start=1):
                self.starts.append(flat_len)
                self.lines.append((page_name, number, line))
                words = line.split()
                piece = " ".join(words) + " " if words else ""
                pieces.append(piece)
                flat_len += len(piece)
        self.flat = "".join(pieces)

    @classmethod
    def pages(cls, root: Path = REPO, names: Sequence[str] = PAGES) -> "Text":
        texts = [(name, (root / name).read_text(encoding="utf-8")) for name in names]
        return cls(texts[0][1], texts[0][0], texts[1:])

    def _line(self, offset: int) -> tuple[str, int, str]:
        return self.lines[bisect.bisect_right(self.starts, offset) - 1]

    def where(self, offset: int) -> str:
        """``page:line`` of the character at ``offset`` of the flat text."""
        page, number, _ = self._line(offset)
        return f"{page}:{number}"

    def context(self, offset: int) -> str:
        """The raw line the character at ``offset`` came from."""
        return self._line(offset)[2]


def digits(readme: str) -> tuple[str, int, int]:
    """A README number as Python reads it, its decimals and its power of ten (``5.4e-4`` → "5.4e-4", 1, -4)."""
    plain = readme.replace(",", "").replace("−", "-")
    mantissa, _, exponent = plain.partition("e")
    return plain, len(mantissa.partition(".")[2]), int(exponent or 0)


def rounded(value: float, readme: str) -> str:
    """``value`` written with as many digits as ``readme``."""
    plain, decimals, _ = digits(readme)
    return f"{value:.{decimals}e}" if "e" in plain else f"{value:.{decimals}f}"


def agrees(kind: str, readme: str, value: float | str) -> bool:
    """Whether the README's ``readme`` says ``value``: equal at the README's rounding, or a bound of it."""
    if kind == "=":
        return readme == str(value)
    plain, decimals, exponent = digits(readme)
    number, value = float(plain), float(value)
    if math.isnan(value):
        return False
    slack = 0.5 * 10.0 ** (exponent - decimals) * (1 + 1e-9)  # half a unit of the last written digit
    if kind == "<=":
        return value <= number + slack
    if kind == ">=":
        return value >= number - slack
    return abs(value - number) <= slack


def read_values(quote: Quote, reports: Reports) -> list[float | str]:
    """The quote's values from the reports; LookupError naming the report when they cannot be read."""
    try:
        values = list(quote.values(reports))
    except (OSError, LookupError, ValueError) as error:
        raise LookupError(f"{quote.source}: cannot read the values of quote {quote.name!r} in tests/test_readme.py: "
                          f"{type(error).__name__}: {error}") from error
    assert len(values) == len(quote.slots()), \
        f"quote {quote.name!r}: {len(quote.slots())} placeholders but {len(values)} values"
    return values


def compare(quote: Quote, text: Text, values: Sequence[float | str]) -> list[str]:
    """Where ``text`` does not say ``values``: one line per wrong number (README line, report, both values)."""
    matches = list(quote.pattern().finditer(text.flat))
    if not matches:
        return [f"{', '.join(PAGES)}: passage of quote {quote.name!r} (tests/test_readme.py) not found — reworded? "
                f"then update the quote too: {quote.passage!r}"]
    found = []
    for match in matches:
        for group, (kind, value) in enumerate(zip(quote.slots(), values), start=1):
            readme = match.group(group)
            if agrees(kind, readme, value):
                continue
            if kind == "=":
                report = repr(value)
            else:
                report = f"{float(value):.6g} (at the page's rounding: {rounded(float(value), readme)})"
            relation = {"": "", "<=": " as an upper bound", ">=": " as a lower bound", "=": ""}[kind]
            context = text.context(match.start(group)).strip()
            context = context if len(context) <= 100 else context[:97] + "..."
            found.append(f"{text.where(match.start(group))}: says {readme}{relation} where {quote.source} gives {report} "
                         f"(quote {quote.name!r}; line: {context!r})")
    return found


def problems(quote: Quote, text: Text, reports: Reports) -> list[str]:
    """Why ``text`` does not say what the reports hold for ``quote``; [] when it does."""
    try:
        return compare(quote, text, read_values(quote, reports))
    except LookupError as error:
        return [str(error)]


# ----------------------------------------------------------------------------------------------------------------
# the quotes, in README order

QUOTES: list[Quote] = []


def quote(name: str, passage: str, source: str, values: Callable[[Reports], Sequence[float | str]]) -> None:
    QUOTES.append(Quote(name, passage, source, values))


def students(reports: Reports) -> pd.DataFrame:
    """One row per distilled student (task, variant, seed), the undistilled global model left out."""
    results = reports.csv("reports/distill/results.csv")
    trained = results[results["loss"].notna()]
    return trained.drop_duplicates(["task", "variant", "seed"])


# --- The two commands (the stage runs themselves were timed by hand: not checked)
quote("teacher count", "train_teachers 2m01s for {} models", "reports/teachers/teachers.csv",
      lambda r: [len(r.csv("reports/teachers/teachers.csv"))])
quote("student count", "for {} students ({} variants × {} seeds × {} task:", "reports/distill/results.csv",
      lambda r: [len(students(r)), students(r)["variant"].nunique(), students(r)["seed"].nunique(),
                 students(r)["task"].nunique()])


# --- Viewing results: what `dvc metrics show` and `dvc plots show` list, counted from dvc.yaml's files
def metric_values(r: Reports) -> list[float | str]:
    files = r.yaml("dvc.yaml")["metrics"]
    return [sum(leaves(r.json(path)) for path in files), NUMBER_WORDS.get(len(files), str(len(files)))]


def png_figures(r: Reports) -> list[float]:
    plots = [next(iter(p)) if isinstance(p, dict) else p for p in r.yaml("dvc.yaml")["plots"]]
    missing = [path for path in plots if not (r.root / path).is_file()]
    if missing:
        raise LookupError(f"dvc.yaml plots not in the checkout: {missing}")
    return [sum(path.endswith(".png") for path in plots)]


quote("dvc metrics", "{} metric values in `dvc metrics show --json` over the {=} stages",
      "dvc.yaml metrics (reports/*/metrics.json)", metric_values)
quote("dvc plots", "`dvc plots show` → `dvc_plots/index.html`: the stages' {} PNG figures",
      "dvc.yaml plots", png_figures)


# --- Scaling out (reports/bench/)
BLAS = "reports/bench/blas_threads.csv"
quote("blas threads", "`python -m bench.blas_threads` ran {} of `fed_distance`'s jobs (its client-pair, coreset and "
      "OTDD sessions) in {} s on one task thread and in {} s on two; with one BLAS thread per task, two task "
      "threads took {} s", BLAS,
      lambda r: [r.row(BLAS, task_threads=1, blas_threads=2)["jobs"],
                 *(r.row(BLAS, task_threads=t, blas_threads=b)["seconds"] for t, b in [(1, 2), (2, 2), (2, 1)])])

ENVIRON = "reports/bench/worker_environ.csv"


def environ_ms(r: Reports, process: str) -> float:
    return r.row(ENVIRON, process=process)["median_ms"]


quote("malloc slowdown", "`MALLOC_TRIM_THRESHOLD_=65536`, which turns off glibc's dynamic mmap threshold, and numpy "
      "code then runs about {}× slower in a worker than in a plain process", ENVIRON,
      lambda r: [environ_ms(r, "dask worker") / environ_ms(r, "default")])

SCALE = "reports/bench/scale_out.csv"


def scale_out(r: Reports, runner: str, column: str = "seconds") -> float:
    return r.row(SCALE, runner=runner)[column]


def prefect_ms_per_job(r: Reports) -> float:
    jobs = r.row(SCALE, runner="sequential")["jobs"]
    return (scale_out(r, "sequential") - scale_out(r, "bare")) / jobs * 1000


quote("scale-out setting", "({} pairs of the {} `pairs_strong` clients, ~{>=}–{<=} ms of work each)",
      "reports/partition/clients.csv, " + SCALE,
      lambda r: [one_value(r.csv(SCALE)["jobs"].tolist(), "jobs"),
                 n_clients(r, "pairs_strong"),
                 *[scale_out(r, "bare") / r.row(SCALE, runner="bare")["jobs"] * 1000] * 2])
quote("scale-out run", "this 2-core machine, load average {}–{}, fastest of two; Prefect's bookkeeping: {} ms per job",
      SCALE, lambda r: [r.csv(SCALE)["load_1min"].min(), r.csv(SCALE)["load_1min"].max(), prefect_ms_per_job(r)])
SCALE_ROWS = {
    "bare loop, no Prefect": "bare",
    "`sequential`": "sequential",
    "`thread` × 2": "thread",
    "`dask`, local cluster started by the stage": "dask, local cluster started by the stage",
    "`dask`, running cluster (`run.dask_address`)": "dask, running cluster (run.dask_address)",
    "`dask`, running cluster, one task per job (no batching)": "dask, running cluster, one task per job (no batching)",
}
for _label, _runner in SCALE_ROWS.items():
    quote(f"scale-out table: {_runner}", f"| {_label} | {{}} | {{}}", SCALE,
          lambda r, runner=_runner: [scale_out(r, runner), scale_out(r, runner, "speedup_vs_sequential")])
RUNNING = "dask, running cluster (run.dask_address)"
UNBATCHED = "dask, running cluster, one task per job (no batching)"
quote("scale-out efficiency", "(efficiency {}: the issue's", SCALE, lambda r: [scale_out(r, RUNNING, "efficiency")])
quote("scale-out batching", "Batching the jobs into {} Dask tasks instead of {} is worth {}× here, and the worker "
      "malloc setting above another ~{}× per job (`reports/bench/worker_environ.md`: {} ms per pair session in a "
      "worker with Dask's default, {} ms with otfed's, {} ms in a plain process)", f"{SCALE}, {ENVIRON}",
      lambda r: [scale_out(r, RUNNING, "dask_tasks"), scale_out(r, UNBATCHED, "dask_tasks"),
                 scale_out(r, UNBATCHED) / scale_out(r, RUNNING),
                 environ_ms(r, "dask worker") / environ_ms(r, "dask worker + otfed"),
                 environ_ms(r, "dask worker"), environ_ms(r, "dask worker + otfed"), environ_ms(r, "default")])
quote("scale-out threads", "Threads gain little on these jobs ({}×)", SCALE,
      lambda r: [scale_out(r, "thread", "speedup_vs_sequential")])

FEDBARY_OUT = "reports/bench/fedbary_scale_out.csv"


def fedbary_out(r: Reports, runner: str, column: str = "seconds") -> float:
    return r.row(FEDBARY_OUT, runner=runner)[column]


quote("fedbary scale-out setting", "`python -m bench.fedbary_scale_out` ({} clients × {} samples, S = {}, K = {}, Q = "
      "the barycenter;", "reports/bench/fedbary_scale_out.md",
      lambda r: [r.md_number("reports/bench/fedbary_scale_out.md", pattern) for pattern in (
          r"(\d+) clients ×", r"× (\d+) samples", r"S = (\d+)", r"K = (\d+)")])
quote("fedbary scale-out", "`reports/bench/fedbary_scale_out.md`, load ≤ {<=}): sequential {} s, threads × {} {} s "
      "({}×), Dask × {} {} s ({}×)", FEDBARY_OUT,
      lambda r: [r.csv(FEDBARY_OUT)["load_1min"].max(), fedbary_out(r, "sequential"),
                 fedbary_out(r, "thread", "workers"), fedbary_out(r, "thread"),
                 fedbary_out(r, "thread", "speedup_vs_sequential"),
                 fedbary_out(r, "dask (running cluster; clients as actors)", "workers"),
                 fedbary_out(r, "dask (running cluster; clients as actors)"),
                 fedbary_out(r, "dask (running cluster; clients as actors)", "speedup_vs_sequential")])


# --- Results on the embedded data: FedWaD (reports/fed_distance/)
TOY = "reports/fed_distance/toy_gaussians.csv"
CONVERGENCE = "reports/fed_distance/convergence.csv"
OTDD = "reports/fed_distance/otdd_pairs.csv"
ARI = "reports/fed_distance/clustering_ari.csv"
CLUSTERED = "reports/fed_distance/clustered_fl.csv"
CORESETS = "reports/fed_distance/coresets.csv"
CLIENTS = "reports/partition/clients.csv"


def toy_error_pct(r: Reports, dim: int, ratio: int, support: int, n: int = 5000,
                  method: str = "fedwad_approx") -> float:
    table = r.csv(TOY)
    cell = table[(table["dim"] == dim) & (table["ratio"] == ratio) & (table["n"] == n)
                 & (table["method"] == method) & (table["support"] == support)]
    if cell.empty or cell["rel_error"].isna().any():
        raise LookupError(f"{TOY}: no relative error for d={dim}, 1:{ratio}, n={n}, {method}, S={support}")
    return 100 * cell["rel_error"].mean()


def convergence(r: Reports, dim: int, support: int, t: str, column: str = "rel_gap",
                interpolation: str = "approx") -> float:
    """The last iteration's value of ``column`` for one setting of the A(k) study (n = 300)."""
    table = r.csv(CONVERGENCE)
    run = table[(table["dim"] == dim) & (table["support"] == support) & (table["t"].astype(str) == t)
                & (table["interpolation"] == interpolation)]
    if run.empty:
        raise LookupError(f"{CONVERGENCE}: no run d={dim}, S={support}, t={t}, {interpolation}")
    return run.sort_values("iteration")[column].iloc[-1]


def otdd_summary(r: Reports) -> dict[str, float]:
    """Federated vs exact OTDD: relative errors, and which order relations between the pairs' distances hold."""
    pairs = r.csv(OTDD)
    rel = ((pairs["federated"] - pairs["exact"]) / pairs["exact"]).abs()
    fed, exact = pairs["federated"].tolist(), pairs["exact"].tolist()
    relations = [(i, j) for i in range(len(pairs)) for j in range(i + 1, len(pairs))]
    broken = [(i, j) for i, j in relations if (fed[i] - fed[j]) * (exact[i] - exact[j]) < 0]
    involved = sorted({exact[k] for pair in broken for k in pair}) or [math.nan]
    spread = max((abs(exact[i] - exact[j]) / min(exact[i], exact[j]) for i, j in broken), default=math.nan)
    return {"mean": 100 * rel.mean(), "max": 100 * rel.max(), "kept": 100 * (1 - len(broken) / len(relations)),
            "broken": NUMBER_WORDS.get(len(broken), str(len(broken))), "low": involved[0], "high": involved[-1],
            "spread": 100 * spread, "messages": one_value(pairs["messages"].tolist(), "messages per pair"),
            "gigabytes": one_value(pairs["bytes"].tolist(), "bytes per pair") / 1e9}


def ari(r: Reports, federation: str, method: str) -> float:
    return r.row(ARI, federation=federation, method=method)["ari"]


def clustered(r: Reports, federation: str, clustering: str, algorithm: str, column: str = "accuracy") -> float:
    return r.row(CLUSTERED, federation=federation, clustering=clustering, algorithm=algorithm)[column]


def coreset(r: Reports, federation: str, method: str, column: str = "accuracy") -> float:
    return r.row(CORESETS, federation=federation, method=method)[column]


def n_clients(r: Reports, federation: str) -> int:
    return int((r.csv(CLIENTS)["federation"] == federation).sum())


FEATURES = "reports/studies/fedbary_features.csv"
WIDE = "reports/valuation/contributions_wide.csv"
AGREEMENT = "reports/valuation/method_agreement.csv"
OUTLIER = "reports/valuation/outlier_distances.csv"
DETECTION = "reports/valuation/detection.csv"
DUPLICATION = "reports/valuation/duplication.csv"
REMOVAL = "reports/removal/removal_summary.csv"
SWEEP = "reports/studies/removal_sweep.md"
SWEEP_CSV = "reports/studies/removal_sweep.csv"
SPEED = "reports/bench/fedwad_speed.csv"
SCALING = "reports/bench/fedbary_scaling_blas1.csv"
SCALING_FIT = "reports/bench/fedbary_scaling_blas1_fit.csv"
USERS = "reports/studies/coreset_users.md"
USERS_CSV = "reports/studies/coreset_users.csv"


def shares(r: Reports, cases: Sequence[str], column: str = "fedbary_validation") -> pd.Series:
    wide = r.csv(WIDE)
    return wide[wide["federation"].isin(cases)][column]


def rho(r: Reports, federation: str, method: str, versus: str = "exact_shapley") -> list[float]:
    row = r.row(AGREEMENT, federation=federation, method=method)
    return [row[f"spearman_vs_{versus}"], row[f"spearman_vs_{versus}_ci95"]]


def detection(r: Reports, kind: str, method: str, column: str) -> list[float]:
    """``column`` of ``method`` at every noise rate, lowest rate first."""
    table = r.csv(DETECTION)
    return table[(table["kind"] == kind) & (table["method"] == method)].sort_values("rate")[column].tolist()


def removal(r: Reports, federation: str, column: str, scale: float = 1.0) -> list[float]:
    row = r.row(REMOVAL, federation=federation)
    return [scale * row[column], scale * row[f"{column}_ci95"]]


def speed(r: Reports, n: int, column: str) -> float:
    return r.row(SPEED, n=n)[column]


def sweep_cells(r: Reports, kind: str | None = None, n: int | None = None) -> list[pd.Series]:
    table = next(t for t in r.md_tables(SWEEP) if "Δ clean" in t.columns)
    return [row for _, row in table.iterrows()
            if (kind is None or row["kind"] == kind) and (n is None or row["n"] == str(n))]


def sweep_levels(r: Reports, n: int) -> list[float]:
    """The noise levels (% of the samples) the sweep ran at ``n`` samples, lowest first."""
    table = r.csv(SWEEP_CSV)
    at_n = table[table["n_train"] == n]
    return sorted({100 * noisy / n for noisy in at_n["noisy"]})


# the feature track's claims table (its verdict marks and the papers' own numbers are not report values)
quote("claims: toy error", "n = 5,000, S = 100: {}% / {}% in 2-D (1:1 / 1:3), but {}% / {}% in 50-D", TOY,
      lambda r: [toy_error_pct(r, 2, 1, 100), toy_error_pct(r, 2, 3, 100), toy_error_pct(r, 50, 1, 100),
                 toy_error_pct(r, 50, 3, 100)])
quote("claims: FedWaD speed", "n = {}: FedWaD {} s vs exact W2 {} s (`reports/bench/fedwad_speed.md`)", SPEED,
      lambda r: [r.csv(SPEED)["n"].max(), speed(r, r.csv(SPEED)["n"].max(), "seconds_auto"),
                 speed(r, r.csv(SPEED)["n"].max(), "seconds_exact")])
quote("claims: convergence", "t = 0.5, S = n: {} (2-D) but {}% (50-D); random t: {} / {}% (`convergence.csv`)",
      CONVERGENCE, lambda r: [convergence(r, 2, 300, "0.5"), 100 * convergence(r, 50, 300, "0.5"),
                              convergence(r, 2, 300, "random"), 100 * convergence(r, 50, 300, "random")])
quote("claims: OTDD", "mean rel. error {}%, {}% of relations kept, {=} broken, their exact distances within {<=}% "
      "(`otdd_pairs.csv`)", OTDD,
      lambda r: [otdd_summary(r)[key] for key in ("mean", "kept", "broken", "spread")])
quote("claims: clustered FL", "ARI {} (strong); FedAvg {} ± {} → {} ± {}, {} ± {} pts (`clustered_fl.csv`)",
      f"{ARI}, {CLUSTERED}",
      lambda r: [ari(r, "pairs_strong", "affinity"),
                 clustered(r, "pairs_strong", "global", "fedavg"),
                 clustered(r, "pairs_strong", "global", "fedavg", "accuracy_ci95"),
                 clustered(r, "pairs_strong", "affinity", "fedavg"),
                 clustered(r, "pairs_strong", "affinity", "fedavg", "accuracy_ci95"),
                 100 * clustered(r, "pairs_strong", "affinity", "fedavg", "uplift_vs_global_fedavg"),
                 100 * clustered(r, "pairs_strong", "affinity", "fedavg", "uplift_vs_global_fedavg_ci95")])
quote("claims: ARI", "ARI strong {} / {} / {}, none {} / {} / {} (affinity / kNN 3 / kNN 5)", ARI,
      lambda r: [ari(r, federation, method) for federation in ("pairs_strong", "pairs_none")
                 for method in ("affinity", "knn3", "knn5")])


def users_clients(r: Reports) -> list[int]:
    return sorted(int(n) for n in r.csv(USERS_CSV)["n_clients"].unique())


def users_row(r: Reports, structure: str, method: str) -> list[float]:
    """Accuracy at each number of clients of the coreset-users bench (means over seeds), fewest clients first."""
    columns = [f"{clients} clients" for clients in users_clients(r)]
    row = r.md_row(USERS, having=columns, structure=structure, method=method)
    return [plus_minus(row[column])[0] for column in columns]


def users_difference(r: Reports, structure: str, versus: str) -> list[float]:
    """Paired coreset (K = 10) − global ``versus`` at the most clients: mean and 95% CI."""
    row = r.md_row(USERS, structure=structure, clients=str(users_clients(r)[-1]), method="coreset K=10")
    return list(plus_minus(row[f"− global {versus}"]))


quote("claims: coresets", "stage, {} clients: K = 10 {} ± {} (no structure) vs FedPer {}, FedRep {} (`coresets.csv`); "
      "{} rows over {} / {} / {} clients: coreset {} / {} / {} vs FedPer {} / {} / {}, FedRep {} / {} / {}; "
      "at {} clients coreset − FedPer {} ± {} (strong: {} ± {}), − FedRep {} ± {} (strong: {} ± {})",
      f"{CORESETS}, {USERS}",
      lambda r: [n_clients(r, "pairs_none"), coreset(r, "pairs_none", "fedwad_coreset K=10"),
                 coreset(r, "pairs_none", "fedwad_coreset K=10", "accuracy_ci95"),
                 coreset(r, "pairs_none", "global fedper"), coreset(r, "pairs_none", "global fedrep"),
                 r.csv(USERS_CSV)["rows_used"].max(), *sorted(r.csv(USERS_CSV)["n_clients"].unique()),
                 *users_row(r, "none", "coreset K=10"), *users_row(r, "none", "global FedPer"),
                 *users_row(r, "none", "global FedRep"), r.csv(USERS_CSV)["n_clients"].max(),
                 *users_difference(r, "none", "FedPer"), *users_difference(r, "strong", "FedPer"),
                 *users_difference(r, "none", "FedRep"), *users_difference(r, "strong", "FedRep")])
quote("claims: iid shares", "{}–{}% (case 1), {}–{}% (case 3), validation target (`contributions_wide.csv`)", WIDE,
      lambda r: [shares(r, ["case1"]).min(), shares(r, ["case1"]).max(),
                 shares(r, ["case3"]).min(), shares(r, ["case3"]).max()])
quote("claims: case 5", "Spearman ρ with the planted order {} ± {} (validation), {} ± {} (barycenter) "
      "(`method_agreement.csv`)", AGREEMENT,
      lambda r: [*rho(r, "case5", "fedbary_validation", "planted"), *rho(r, "case5", "fedbary_barycenter", "planted")])
quote("claims: case 4", "ρ {} ± {} (shares {}–{}%)", f"{AGREEMENT}, {WIDE}",
      lambda r: [*rho(r, "case4", "fedbary_validation", "planted"), shares(r, ["case4"]).min(),
                 shares(r, ["case4"]).max()])
GAME_VALUES = ["exact_shapley", "one_round", "multi_round", "gtg_shapley"]
quote("claims: Shapley noise", "ρ with exact Shapley {} ± {} over cases; exact Shapley, OR, MR and GTG-Shapley of the "
      "FedAvg utility are noise at {} × {} samples (shares {}% to {}%; ρ with the planted order in case 5: "
      "{} ± {}, {} ± {}, {} ± {}, {} ± {})", f"{AGREEMENT}, {WIDE}, {CLIENTS}",
      lambda r: [*rho(r, "all (mean ρ)", "fedbary_validation"), *case_size(r),
                 r.csv(WIDE)[GAME_VALUES].min().min(), r.csv(WIDE)[GAME_VALUES].max().max(),
                 *(v for method in GAME_VALUES for v in rho(r, "case5", method, "planted"))])
quote("claims: outlier", "| the noisy client is farthest from the federated barycenter | {} vs ≤ {} "
      "(`outlier_distances.csv`)", OUTLIER, lambda r: outlier(r))
quote("claims: feature detection", "ROC AUC {} and recall {} at {} / {} / {}% (`detection.csv`)", DETECTION,
      lambda r: [one_value(detection(r, "feature", "fedbary", "auc"), "feature-noise AUC"),
                 one_value(detection(r, "feature", "fedbary", "recall"), "feature-noise recall"),
                 *(100 * rate for rate in detection(r, "feature", "fedbary", "rate"))])
quote("claims: label detection", "recall {} / {} / {} at precision {} / {} / {}, AUC {}–{}, LAVA alike (AUC {}–{})",
      DETECTION,
      lambda r: [*detection(r, "label", "fedbary", "recall"), *detection(r, "label", "fedbary", "precision"),
                 min(detection(r, "label", "fedbary", "auc")), max(detection(r, "label", "fedbary", "auc")),
                 min(detection(r, "label", "lava", "auc")), max(detection(r, "label", "lava", "auc"))])
quote("claims: duplication", "≤ {<=} relative change of the exact W and FedBary's estimates, {}–{} extra copies "
      "(`duplication.csv`)", DUPLICATION,
      lambda r: [duplication(r)["change"], duplication(r)["fewest"], duplication(r)["most"]])
quote("claims: removal", "g > 0: {} ± {} → {} ± {} (label); validation-chosen budget {} ± {} / {} ± {} pts; even the "
      "oracle gains only {} ± {} / {} ± {} pts, because {}% noise costs this model < {<=} point "
      "(`python -m studies.removal_sweep`, {} seeds: at {}–{}% noise it costs {}–{} pts, the oracle wins it back, "
      "FedBary's budget rule does not: {} to {})", f"{REMOVAL}, {SWEEP}, {SWEEP_CSV}",
      lambda r: [*removal(r, "fmnist_label_noise", "accuracy_before"),
                 *removal(r, "fmnist_label_noise", "accuracy_flagged"),
                 *removal(r, "fmnist_label_noise", "gain_budget", 100),
                 *removal(r, "fmnist_feature_noise", "gain_budget", 100),
                 *removal(r, "fmnist_label_noise", "gain_oracle_removal", 100),
                 *removal(r, "fmnist_feature_noise", "gain_oracle_removal", 100),
                 stage_noise_pct(r), max(plus_minus(c["Δ clean"])[0] for c in sweep_cells(r) if c["noisy"].endswith(
                     f"({round(stage_noise_pct(r))}%)")),
                 r.csv(SWEEP_CSV)["seed"].nunique(), sweep_levels(r, sweep_sizes(r)[0])[1],
                 sweep_levels(r, sweep_sizes(r)[0])[-1],
                 *min_max(plus_minus(c["Δ clean"])[0] for c in heavy_noise_cells(r)),
                 *min_max(plus_minus(c["Δ budget"])[0] for c in heavy_noise_cells(r))])
quote("claims: FedBary scaling", "{} clients × {} samples, S = {}: {} s / {} s, R² ≥ {>=} "
      "(`reports/bench/fedbary_scaling_blas1.md`)", f"{SCALING}, {SCALING_FIT}",
      lambda r: [*largest_scaling_run(r), scaling_seconds(r, "validation"), scaling_seconds(r, "barycenter"),
                 r.csv(SCALING_FIT).query("clock == 'wall'")["r2"].min()])


ATTACK = "reports/fed_distance/privacy_attack.csv"
DP = "reports/fed_distance/privacy_dp.csv"
DP_CLUSTERING = "reports/fed_distance/privacy_dp_clustering.csv"


def attacked(r: Reports, column: str, **cell: object) -> float:
    """The mean of ``column`` over the attack runs of one cell (protocol, support, t, iterations, …)."""
    rows = r.csv(ATTACK)
    for key, value in cell.items():
        rows = rows[rows[key].astype(str) == str(value)]
    if rows.empty:
        raise LookupError(f"{ATTACK}: no run with {cell}")
    return float(rows[column].mean())


def dp_cell(r: Reports, column: str, epsilon: str) -> float:
    """The mean of ``column`` over the DP runs at S = n, random t and ``epsilon`` (as the CSV writes it)."""
    rows = r.csv(DP)
    rows = rows[(rows["support"].astype(str) == "n") & (rows["t"] == "random") & (rows["epsilon"].astype(str) == epsilon)]
    if rows.empty:
        raise LookupError(f"{DP}: no run at S = n, random t, epsilon {epsilon}")
    return float(rows[column].mean())


def dp_ari(r: Reports, epsilon: str) -> float:
    rows = r.csv(DP_CLUSTERING)
    return float(rows[(rows["method"] == "affinity") & (rows["epsilon"].astype(str) == epsilon)]["ari"].iloc[0])


FEDWAD_DEFENCES = dict(protocol="fedwad", interpolation="approx", t="random", iterations=10, distances="last")
quote("claims: FedWaD privacy", "S = n: the server recovers {}% of a client's samples under both defences (the attack "
      "reads t off the interpolants' means, K = {}); S = 50: {}% (non-members {}%); S = 10: {}% (non-members {}%)",
      f"{ATTACK}, reports/fed_distance/metrics.json",
      lambda r: [100 * r.json("reports/fed_distance/metrics.json")["privacy"]["fedwad_recovered_paper_defences_S_n"],
                 FEDWAD_DEFENCES["iterations"],
                 100 * attacked(r, "recovered_fraction", support=50, **FEDWAD_DEFENCES),
                 100 * attacked(r, "non_member_fraction", support=50, **FEDWAD_DEFENCES),
                 100 * attacked(r, "recovered_fraction", support=10, **FEDWAD_DEFENCES),
                 100 * attacked(r, "non_member_fraction", support=10, **FEDWAD_DEFENCES)])
quote("claims: FedBary privacy", "S = n, random t, Q the federated barycenter: {}% recovered, labels up to naming "
      "(ARI {})", ATTACK,
      lambda r: [100 * attacked(r, "recovered_fraction", protocol="fedbary", support="n", t="random", iterations=10,
                                validation=False, distances="every round"),
                 attacked(r, "label_ari", protocol="fedbary", support="n", t="random", iterations=10,
                          validation=False, distances="every round")])
DP_AUDIT = "reports/fed_distance/privacy_dp_audit.csv"


def dp_audit(r: Reports, target: str, epsilon: str, columns: tuple[str, ...]) -> list[float]:
    """The strongest attacks' scores on ``target`` at ``epsilon`` (as the CSV writes it), in ``columns``' order."""
    rows = r.csv(DP_AUDIT)
    rows = rows[(rows["target"] == target) & (rows["epsilon"].astype(str) == epsilon)]
    if len(rows) != 1:
        raise LookupError(f"{DP_AUDIT}: {len(rows)} rows for {target} at epsilon {epsilon}")
    return [float(rows[column].iloc[0]) for column in columns]


quote("claims: DP FedWaD", "there no attack beats chance (round-averaged membership AUC {} [{}, {}], clip-radius "
      "canaries {} [{}, {}], client_00, ε = 1), but the relative error at S = n, random t is {} at ε = 10 (no DP: {}); "
      "at ε = 1e5 (no formal guarantee) canaries are found every time (AUC {})", f"{DP}, {DP_AUDIT}",
      lambda r: [*dp_audit(r, "client_00", "1.0", ("averaged_auc", "averaged_auc_low", "averaged_auc_high",
                                                      "canary_auc", "canary_auc_low", "canary_auc_high")),
                 dp_cell(r, "rel_error", "10.0"), dp_cell(r, "fedwad_rel_error", "10.0"),
                 *dp_audit(r, "client_00", "100000.0", ("canary_auc",))])


DP_FEDBARY = "reports/fed_distance/privacy_dp_fedbary_summary.csv"
DP_DETECTION = "reports/valuation/privacy_dp_detection_summary.csv"
MEMBERSHIP = "reports/studies/knot_membership.csv"


def dp_fedbary(r: Reports, column: str, epsilon: str) -> float:
    rows = r.csv(DP_FEDBARY)
    rows = rows[(rows["support"].astype(str) == "n") & (rows["epsilon"].astype(str) == epsilon)]
    return one_value(rows[column].tolist(), f"{DP_FEDBARY} S = n, epsilon {epsilon}")


def dp_detection(r: Reports, kind: str, epsilon: str) -> float:
    rows = r.csv(DP_DETECTION)
    rows = rows[(rows["kind"] == kind) & (rows["epsilon"].astype(str) == epsilon)]
    return one_value(rows["auc"].tolist(), f"{DP_DETECTION} {kind}, epsilon {epsilon}")


def membership(r: Reports, task: str, column: str) -> float:
    rows = r.csv(MEMBERSHIP)
    rows = rows[rows["task"] == task]
    if column == "gap":
        return float((rows["member_accuracy"] - rows["non_member_accuracy"]).mean())
    return float(rows[column].mean())


quote("claims: DP FedBary", "at S = n the attack recovers {}% at ε = 1e5 (non-members {}%), {}% without noise "
      "(`privacy_dp_fedbary_summary.csv`); noisy-data detection ROC AUC at ε = 1: {} for label noise (no DP: {}), "
      "{} for feature noise (no DP: {})", f"{DP_FEDBARY}, {DP_DETECTION}",
      lambda r: [100 * dp_fedbary(r, "recovered", "100000.0"), 100 * dp_fedbary(r, "non_member", "100000.0"),
                 100 * dp_fedbary(r, "recovered", "inf"), dp_detection(r, "label", "1.0"),
                 dp_detection(r, "label", "no DP"), dp_detection(r, "feature", "1.0"),
                 dp_detection(r, "feature", "no DP")])
quote("claims: KNOT membership", "loss-attack ROC AUC {} (NLI), {} (SA), {} (ERC), mean over teachers; train − unseen "
      "accuracy gap {} / {} / {}", MEMBERSHIP,
      lambda r: [membership(r, "nli", "loss_auc"), membership(r, "sa", "loss_auc"), membership(r, "erc", "loss_auc"),
                 membership(r, "nli", "gap"), membership(r, "sa", "gap"), membership(r, "erc", "gap")])


def all_or_count(count: int, total: int) -> str:
    return "all" if count == total else f"{count}-of"


def min_max(values: Iterator[float] | Sequence[float]) -> list[float]:
    values = list(values)
    return [min(values), max(values)]


def case_size(r: Reports) -> list[float]:
    """Clients per FedBary case and samples per client (train + validation) of the equal-sized case 1."""
    case1 = r.csv(CLIENTS)[r.csv(CLIENTS)["federation"] == "case1"]
    return [len(case1), one_value((case1["n_train"] + case1["n_val"]).tolist(), "case 1 client size")]


def outlier(r: Reports) -> list[float]:
    distances = r.csv(OUTLIER)[r.csv(OUTLIER)["target"] == "barycenter"]
    noisy = distances[distances["noisy"].astype(str) == "True"]
    return [one_value(noisy["distance"].tolist(), "the noisy client's distance"),
            distances[distances["noisy"].astype(str) == "False"]["distance"].max()]


def duplication(r: Reports) -> dict[str, float]:
    table = r.csv(DUPLICATION)
    copies = table[(table["experiment"] == "dataset") & (table["stats"] == "original") & (table["copies"] > 1)]
    changes = copies[["exact_w_rel_change", "fedbary_validation_rel_change", "fedbary_barycenter_rel_change"]]
    datum = table[table["experiment"] == "datum"]
    return {"change": changes.abs().max().max(), "fewest": copies["copies"].min() - 1,
            "most": copies["copies"].max() - 1, "datum": one_value((datum["copies"] - 1).tolist(), "datum copies")}


def stage_noise_pct(r: Reports) -> float:
    row = r.row(REMOVAL, federation="fmnist_label_noise")
    n_train = one_value(r.csv("reports/removal/removal.csv")["n_train"].tolist(), "n_train")
    return 100 * row["noisy"] / n_train


def heavy_noise_cells(r: Reports) -> list[pd.Series]:
    """The sweep's cells above the stage's noise level, at the stage's sample size."""
    small = sweep_sizes(r)[0]
    return [c for c in sweep_cells(r, n=small) if int(c["noisy"].split()[0]) > stage_noise_pct(r) / 100 * small]


def largest_scaling_run(r: Reports) -> list[float]:
    table = r.csv(SCALING)
    return [table["clients"].max(), one_value(table["samples"].tolist(), "samples per client"),
            table["support"].max()]


def scaling_seconds(r: Reports, target: str, clients: int | None = None, support: int | None = None) -> float:
    table = r.csv(SCALING)
    clients = clients or table["clients"].max()
    support = support or table["support"].max()
    return r.row(SCALING, target=target, clients=clients, support=support)["seconds"]


# FedWaD details
for _dim, _ratio in [(2, 1), (2, 3), (50, 1), (50, 3)]:
    quote(f"toy table d={_dim} 1:{_ratio}", f"| d = {_dim}, ratio 1:{_ratio} | {{}}% | {{}}% | {{}}% |", TOY,
          lambda r, dim=_dim, ratio=_ratio: [toy_error_pct(r, dim, ratio, support) for support in (2, 10, 100)])
quote("toy exact interpolation", "Exact-interpolation FedWaD (support starting at n) reaches {} (d = 2, 1:1) and "
      "{}% / {}% (d = 50, 1:1 / 1:3) at n = 300; at d = 2, 1:3 its support grew beyond {}·n atoms and the cell is "
      "recorded as skipped", TOY,
      lambda r: [toy_error_pct(r, 2, 1, 300, 300, "fedwad_exact_interp") / 100,
                 toy_error_pct(r, 50, 1, 300, 300, "fedwad_exact_interp"),
                 toy_error_pct(r, 50, 3, 300, 300, "fedwad_exact_interp"), support_growth(r)])


def support_growth(r: Reports) -> float:
    """The support cap (a multiple of n) the skipped exact-interpolation cell (d = 2, 1:3, n = 300) ran into."""
    table = r.csv(TOY)
    cell = table[(table["dim"] == 2) & (table["ratio"] == 3) & (table["n"] == 300)
                 & (table["method"] == "fedwad_exact_interp")]
    match = re.search(r"max_support=(\d+)", str(cell["note"].iloc[0])) if len(cell) == 1 else None
    if match is None:
        raise LookupError(f"{TOY}: the d=2, 1:3, n=300 exact-interpolation cell is not a skipped one")
    return int(match.group(1)) / 300


quote("convergence", "A(k)/W − 1 after {} iterations, n = {}): random t, S = n → {} (d = 2) and {}% (d = 50); fixed "
      "t = 0.5, S = n → {} (d = 2) and **{}% (d = 50)**", CONVERGENCE,
      lambda r: [r.csv(CONVERGENCE)["iteration"].max(), one_value(r.csv(CONVERGENCE)["n"].tolist(), "n"),
                 convergence(r, 2, 300, "random"), 100 * convergence(r, 50, 300, "random"),
                 convergence(r, 2, 300, "0.5"), 100 * convergence(r, 50, 300, "0.5")])
quote("support sweep", "in d = 2, S = {} is already within {}%; in d = 50 the error stays at {}% (S = 10), {}% (100), "
      "{}% (200), {}% (250), {}% (280) and first falls below 5% at S = {} ({}%; S = n = 300: {}%)",
      f"{CONVERGENCE}, reports/fed_distance/metrics.json",
      lambda r: support_sweep(r))


def support_sweep(r: Reports) -> list[float]:
    """The smallest S whose final error is below 5% (as the stage's metrics name it) and the errors (%)."""
    needed = r.json("reports/fed_distance/metrics.json")["toy"]

    def error(dim: int, support: int) -> float:
        return 100 * convergence(r, dim, support, "random", "estimate_rel_error")

    return [needed["support_needed_d2_below_5pct"], error(2, int(needed["support_needed_d2_below_5pct"])),
            *(error(50, support) for support in (10, 100, 200, 250, 280)), needed["support_needed_d50_below_5pct"],
            error(50, int(needed["support_needed_d50_below_5pct"])), error(50, 300)]
quote("OTDD", "mean relative error to the exact OTDD {}% (max {}%), **{}% of order relations preserved** — the {=} "
      "broken relations are between exact distances {}–{}, within {<=}% of each other. Communication: {} messages, "
      "{} GB per pair", OTDD,
      lambda r: [otdd_summary(r)[key] for key in ("mean", "max", "kept", "broken", "low", "high", "spread",
                                                  "messages", "gigabytes")])
quote("OTDD setting", "and FashionMNIST, {} samples each", CLIENTS,
      lambda r: [one_value(r.csv(CLIENTS)[r.csv(CLIENTS)["federation"] == "otdd_benchmarks"]["n_train"].tolist(),
                           "OTDD samples per dataset")])
quote("clustering setting", "**Client clustering** ({} MNIST clients, pairwise federated OTDD with S = 10, K = 10; {} "
      "pairs per federation)", f"{CLIENTS}, reports/fed_distance/clustering_pairs_strong_distances.csv",
      lambda r: [n_clients(r, "pairs_strong"),
                 math.comb(len(r.csv("reports/fed_distance/clustering_pairs_strong_distances.csv")), 2)])
quote("ARI table strong", "| strong structure | **{}** | **{}** | **{}** |", ARI,
      lambda r: [ari(r, "pairs_strong", method) for method in ("affinity", "knn3", "knn5")])
quote("ARI table none", "| no structure (random pair per client) | {} | {} | {} |", ARI,
      lambda r: [ari(r, "pairs_none", method) for method in ("affinity", "knn3", "knn5")])
quote("clustered FL seeds", "each client is scored on its own held-out split, pooled over clients; mean ± 95% CI over "
      "{} seeds, uplift paired by seed", CLUSTERED, lambda r: [one_value(r.csv(CLUSTERED)["seeds"].tolist(), "seeds")])


def clustered_row(r: Reports, federation: str) -> list[float]:
    def accuracy(clustering: str, algorithm: str) -> float:
        return clustered(r, federation, clustering, algorithm)

    return [accuracy("global", "fedavg"), clustered(r, federation, "global", "fedavg", "accuracy_ci95"),
            accuracy("affinity", "fedavg"), clustered(r, federation, "affinity", "fedavg", "accuracy_ci95"),
            100 * clustered(r, federation, "affinity", "fedavg", "uplift_vs_global_fedavg"),
            100 * clustered(r, federation, "affinity", "fedavg", "uplift_vs_global_fedavg_ci95"),
            accuracy("global", "fedper"), accuracy("global", "fedrep"),
            accuracy("affinity", "fedper"), accuracy("affinity", "fedrep")]


quote("clustered FL strong", "| strong | {} ± {} | **{} ± {}** | **{} ± {} pts** | {} / {} | {} / {} |", CLUSTERED,
      lambda r: clustered_row(r, "pairs_strong"))
quote("clustered FL none", "| none | {} ± {} | {} ± {} | {} ± {} pts | {} / {} | {} / {} |", CLUSTERED,
      lambda r: clustered_row(r, "pairs_none"))


def personalised(r: Reports) -> list[float]:
    """Global FedPer / FedRep accuracy (lowest, highest) and the most clustering adds to them (points)."""
    table = r.csv(CLUSTERED)
    heads = table[table["algorithm"].isin(["fedper", "fedrep"])]
    pivot = heads.pivot_table(index=["federation", "algorithm"], columns="clustering", values="accuracy")
    return [*min_max(pivot["global"].tolist()), 100 * (pivot["affinity"] - pivot["global"]).max()]


quote("personalised heads", "Personalised heads (FedPer, FedRep) already reach {}–{} without clustering on these "
      "two-class clients, so clustering adds at most {<=} points to them here", CLUSTERED, personalised)


def coreset_row(r: Reports, federation: str) -> list[float]:
    values: list[float] = []
    for method in ("fedwad_coreset K=5", "fedwad_coreset K=10", "exact_coreset K=10", "global fedavg"):
        values += [coreset(r, federation, method), coreset(r, federation, method, "accuracy_ci95")]
    return values + [coreset(r, federation, "global fedper"), coreset(r, federation, "global fedrep")]


quote("coresets setting", "labelled coresets, on the same held-out splits, {} seeds:", CORESETS,
      lambda r: [one_value(r.csv(CORESETS)["seeds"].tolist(), "seeds")])
quote("coresets none", "| no structure | {} ± {} | {} ± {} | {} ± {} | {} ± {} | {} / {} |", CORESETS,
      lambda r: coreset_row(r, "pairs_none"))
quote("coresets strong", "| strong | {} ± {} | {} ± {} | {} ± {} | {} ± {} | {} / {} |", CORESETS,
      lambda r: coreset_row(r, "pairs_strong"))


def coreset_findings(r: Reports) -> list[float]:
    """How far the federated coresets' W2 to the client data is from the exact ones' (%), and how many points
    the federated-coreset classifier beats global FedAvg by (lowest, highest)."""
    table = r.csv(CORESETS).set_index(["federation", "method"])
    w2_gaps, fedavg_gains = [], []
    for federation in ("pairs_none", "pairs_strong"):
        for points in (5, 10):
            federated = table.loc[(federation, f"fedwad_coreset K={points}")]
            exact = table.loc[(federation, f"exact_coreset K={points}")]
            w2_gaps.append(100 * abs(federated["mean_client_w2"] / exact["mean_client_w2"] - 1))
            fedavg_gains.append(100 * (federated["accuracy"] - table.loc[(federation, "global fedavg")]["accuracy"]))
    return [max(w2_gaps), *min_max(fedavg_gains)]


quote("coresets findings", "(and their W_2 to the client data is within {<=}%: `mean_client_w2`); the coreset "
      "classifier beats global FedAvg by {}–{} points", CORESETS, coreset_findings)


def users_csv(r: Reports) -> pd.DataFrame:
    return r.csv(USERS_CSV)


quote("more users setting", "**More users** (`python -m studies.coreset_users`, {} min; "
      "`reports/studies/coreset_users.{md,png}`): the same comparison with the {} MNIST training rows spread over "
      "{}, {} and {} clients ({} / {} / {} samples per client, two classes each, the stage's settings; seeds {}–{}",
      USERS_CSV,
      lambda r: [r.md_number(USERS, r"— ([\d.]+) min on"), one_value(users_csv(r)["rows_used"].tolist(), "rows"),
                 *sorted(users_csv(r)["n_clients"].unique()),
                 *users_csv(r).groupby("n_clients")["samples_mean"].mean().sort_index().tolist(),
                 users_csv(r)["seed"].min(), users_csv(r)["seed"].max()])
quote("more users", "The federated-coreset 1-NN (K = 10) stays flat — {} / {} / {} with no structure, {} / {} / {} "
      "with strong structure — while global FedPer falls from {} to {} (none) and from {} to {} (strong), and FedRep "
      "from {} to {} and from {} to {}. At {} clients the coreset classifier beats FedPer (paired by seed: {} ± {}, "
      "strong {} ± {}) but not FedRep ({} ± {}, strong {} ± {};", USERS,
      lambda r: [*users_row(r, "none", "coreset K=10"), *users_row(r, "strong", "coreset K=10"),
                 *users_row(r, "none", "global FedPer")[::2], *users_row(r, "strong", "global FedPer")[::2],
                 *users_row(r, "none", "global FedRep")[::2], *users_row(r, "strong", "global FedRep")[::2],
                 users_csv(r)["n_clients"].max(),
                 *users_difference(r, "none", "FedPer"), *users_difference(r, "strong", "FedPer"),
                 *users_difference(r, "none", "FedRep"), *users_difference(r, "strong", "FedRep")])


def exact_vs_federated_coresets(r: Reports) -> float:
    """The largest gap between exact and federated coresets' accuracy over the bench's cells (means over seeds)."""
    means = users_csv(r).groupby(["structure", "n_clients", "method"])["accuracy"].mean()
    gaps = [abs(means[(s, n, f"exact coreset K={k}")] - means[(s, n, f"coreset K={k}")])
            for s, n, _ in means.index for k in (5, 10)]
    return max(gaps)


quote("more users details", "in all at {} training samples — not from the coreset classifier improving. Exact "
      "(non-federated) coresets score within {<=} of the FedWaD ones in every cell", USERS_CSV,
      lambda r: [users_csv(r)[users_csv(r)["n_clients"] == users_csv(r)["n_clients"].max()]["train_mean"].mean(),
                 exact_vs_federated_coresets(r)])


# FedBary details (reports/valuation/, reports/removal/, reports/bench/)
CONTRIBUTIONS = "reports/valuation/contributions.csv"
quote("FedBary setting", "CIFAR-10 cases with {} × {} samples, FashionMNIST detection and removal sets; mean ± 95% CI "
      "over {} seeds)", f"{CLIENTS}, {CONTRIBUTIONS}, {REMOVAL}",
      lambda r: [*case_size(r), one_value([r.csv(CONTRIBUTIONS)["seed"].nunique(), *r.csv(REMOVAL)["seeds"]],
                                          "seeds")])


def features(r: Reports, features: str, experiment: str, column: str = "value") -> float | str:
    return r.row(FEATURES, features=features, experiment=experiment)[column]


def feature_shares(r: Reports, name: str) -> list[float]:
    return [float(share) for share in str(features(r, name, "contributions case5", "shares")).split("/")]


def feature_dims(r: Reports) -> list[float]:
    """The projection's and the PCA's dimensions, as the bench names its feature sets."""
    names = r.csv(FEATURES)["features"].unique()
    projection = next(name for name in names if name.startswith("random_projection"))
    pca = next(name for name in names if name.startswith("pca"))
    return [int(projection.removeprefix("random_projection")), int(pca.removeprefix("pca"))]


quote("FedBary features", "The default is now a {}-D Gaussian random projection of the pixels", FEATURES,
      lambda r: feature_dims(r)[:1])
quote("FedBary features: case 5", "Case 5 shares: raw pixels {} / {} / {} / {} / {}%, random projection "
      "{} / {} / {} / {} / {}%, PCA-{} {} / {} / {} / {} / {}% (ρ with the planted order {}, {}, {}); feature-noise "
      "detection AUC {} / {} / {}; one FedBary run on case 5 took {} s on raw pixels and {} s projected", FEATURES,
      lambda r: [*feature_shares(r, "raw"), *feature_shares(r, "random_projection256"), feature_dims(r)[1],
                 *feature_shares(r, "pca32"),
                 *(features(r, name, "contributions case5") for name in ("raw", "random_projection256", "pca32")),
                 *(features(r, name, "detection feature 15%") for name in ("raw", "random_projection256", "pca32")),
                 features(r, "raw", "contributions case5", "seconds"),
                 features(r, "random_projection256", "contributions case5", "seconds")])
quote("contributions", "feature noise (case 5) — FedBary's shares fall monotonically with the planted noise, "
      "{} / {} / {} / {} / {}%, Spearman ρ with the planted order **{} ± {}** (validation target) and {} ± {} "
      "(barycenter). Label noise (case 4) stays invisible: shares {}–{}%, ρ = {} ± {} (slightly the wrong way). "
      "Cases 1 and 3: {}–{}% (equal, as the paper expects). Exact Shapley of the FedAvg utility is no usable "
      "ground truth at this size: its shares range from {}% to {}% within one case, its values sum to 0 on seed {} "
      "of cases {}, {} and {} (no shares there, so ρ with it rests on {=} seeds in those cases), and its ρ with the "
      "planted order is {} ± {} (case 5); so FedBary's ρ with exact Shapley ({} ± {} over all cases)",
      f"{WIDE}, {AGREEMENT}, {CONTRIBUTIONS}",
      lambda r: [*r.csv(WIDE)[r.csv(WIDE)["federation"] == "case5"].sort_values("planted_noise")["fedbary_validation"],
                 *rho(r, "case5", "fedbary_validation", "planted"), *rho(r, "case5", "fedbary_barycenter", "planted"),
                 *min_max(shares(r, ["case4"])), *rho(r, "case4", "fedbary_validation", "planted"),
                 *min_max(shares(r, ["case1", "case3"])), *widest_case(r, "exact_shapley"),
                 *no_exact_shapley_shares(r), *rho(r, "case5", "exact_shapley", "planted"),
                 *rho(r, "all (mean ρ)", "fedbary_validation")])


def no_exact_shapley_shares(r: Reports) -> list[float | str]:
    """The seed and the cases whose exact Shapley values sum to 0 (so no share, :func:`percent_of_total`), and in
    words how many seeds are left for ρ with exact Shapley in those cases."""
    table = r.csv(CONTRIBUTIONS)
    exact = table[table["method"] == "exact_shapley"]
    runs = exact[exact["percent"].isna()][["federation", "seed"]].drop_duplicates()
    if len(runs) != 3:
        raise LookupError(f"{CONTRIBUTIONS}: exact Shapley has no shares on {len(runs)} case × seed runs; "
                          "the README names 3")
    seed = one_value(runs["seed"].tolist(), "the seed without exact Shapley shares")
    cases = sorted(int(case.removeprefix("case")) for case in runs["federation"])
    left = [r.row(AGREEMENT, federation=f"case{case}", method="fedbary_validation")["spearman_vs_exact_shapley_n"]
            for case in cases]
    return [seed, *cases, NUMBER_WORDS.get(int(one_value(left, "seeds left")), str(left[0]))]


def widest_case(r: Reports, method: str) -> list[float]:
    """The lowest and highest share of ``method`` within the one case where they spread most."""
    by_case = r.csv(WIDE).groupby("federation")[method].agg(["min", "max"])
    widest = (by_case["max"] - by_case["min"]).idxmax()
    return [by_case.loc[widest, "min"], by_case.loc[widest, "max"]]


FL_BASELINES = ("one_round", "multi_round", "gtg_shapley", "tmc_shapley")
AGREEMENT_SEEDS = "reports/valuation/method_agreement_seeds.csv"


def intervals_excluding_zero(r: Reports) -> str:
    """"one" when GTG-Shapley's is the only FL baseline's mean ρ with exact Shapley whose 95% CI excludes 0."""
    excluding = [method for method in FL_BASELINES
                 if abs(rho(r, "all (mean ρ)", method)[0]) > rho(r, "all (mean ρ)", method)[1]]
    return "one" if excluding == ["gtg_shapley"] else f"not-only-GTG:{','.join(excluding) or 'none'}"


def gtg_seeds(r: Reports) -> list[float | str]:
    """GTG-Shapley's ρ with exact Shapley: how many seeds (in words), the lowest and highest seed mean over the
    cases, and the lowest and highest single case × seed ρ."""
    table = r.csv(AGREEMENT_SEEDS)
    gtg = table[table["method"] == "gtg_shapley"]
    means = gtg.groupby("seed")["spearman_vs_exact_shapley"].mean()
    return [NUMBER_WORDS.get(len(means), str(len(means))), *min_max(means.tolist()),
            *min_max(gtg["spearman_vs_exact_shapley"].dropna().tolist())]


quote("FL baselines", "are just as noisy here: ρ with exact Shapley {} ± {} (OR), {} ± {} (MR), {} ± {} (GTG: the {=} "
      "interval that excludes 0, because its {=} seeds' means over the cases happen to agree, {}–{}, while its "
      "single case × seed runs range from {} to {}), {} ± {} (DataSV,", f"{AGREEMENT}, {AGREEMENT_SEEDS}",
      lambda r: [*rho(r, "all (mean ρ)", "one_round"), *rho(r, "all (mean ρ)", "multi_round"),
                 *rho(r, "all (mean ρ)", "gtg_shapley"), intervals_excluding_zero(r), *gtg_seeds(r),
                 *rho(r, "all (mean ρ)", "tmc_shapley")])


def datasv_vs_monte_carlo(r: Reports) -> list[float | str]:
    """"all" when DataSV's (truncated Monte-Carlo) client values equal Monte-Carlo Shapley's on every run (case ×
    seed), else how many, and how many runs there are."""
    table = r.csv(CONTRIBUTIONS)
    values = table.pivot_table(index=["federation", "seed", "client"], columns="method", values="value")
    gap = (values["tmc_shapley"] - values["monte_carlo_shapley"]).abs()
    per_run = gap.groupby(level=["federation", "seed"]).max()
    return [all_or_count(int((per_run <= 1e-9).sum()), len(per_run)), len(per_run)]


quote("DataSV vs Monte-Carlo", "(DataSV, which equals Monte-Carlo Shapley on {=} {} case × seed runs: its 1% "
      "truncation never changed a value);", CONTRIBUTIONS, datasv_vs_monte_carlo)
quote("FL baselines, case 5", "with the planted order in case 5 {} ± {}, {} ± {}, {} ± {} — neither", AGREEMENT,
      lambda r: [v for method in ("one_round", "multi_round", "gtg_shapley")
                 for v in rho(r, "case5", method, "planted")])
quote("FL baselines, size", "nor the right order is decidable at {} × {} samples.", CLIENTS, case_size)
# The values before the kernels were held portable (-0.16 ± 0.46, -0.10 ± 0.44, 46.7 points on case 1, seed 2) are
# an earlier run's: commit 5f109f3f6c84999cb048dbbd4254e6b0f3cbeba7's reports/valuation/method_agreement.csv and
# contributions.csv; not checked here (no committed report holds them once these are committed).
quote("valuation noise", "FedBary's ρ with exact Shapley over all cases was −0.16 ± 0.46 and GTG's −0.10 ± 0.44 (now "
      "{} ± {} and {} ± {})", AGREEMENT,
      lambda r: [*rho(r, "all (mean ρ)", "fedbary_validation"), *rho(r, "all (mean ρ)", "gtg_shapley")])
quote("outlier", "it is the farthest from the federated barycenter ({} vs ≤ {}).", OUTLIER, outlier)
quote("detection", "feature noise **{}** at {} / {} / {}% (LAVA {}, KNN-Shapley {}–{}, LOO {}–{}) — the paper's \"100% "
      "on feature noise\"; label noise {}–{} (LAVA {}–{}; KNN-Shapley, with data access, {}–{})", DETECTION,
      lambda r: [one_value(detection(r, "feature", "fedbary", "auc"), "FedBary's feature-noise AUC"),
                 *(100 * rate for rate in detection(r, "feature", "fedbary", "rate")),
                 one_value(detection(r, "feature", "lava", "auc"), "LAVA's feature-noise AUC"),
                 *min_max(detection(r, "feature", "knn_shapley", "auc")),
                 *min_max(detection(r, "feature", "leave_one_out", "auc")),
                 *min_max(detection(r, "label", "fedbary", "auc")), *min_max(detection(r, "label", "lava", "auc")),
                 *min_max(detection(r, "label", "knn_shapley", "auc"))])
quote("removal", "flagging g > 0 removes {} ± {} of {} points (label noise) and lowers FedAvg from {} ± {} to {} ± {}; "
      "a removal budget chosen on the server's validation set (never the test set) keeps accuracy level (label "
      "{} ± {} points, feature {} ± {}). Why no gain: **removing exactly the noisy points (oracle) does not help "
      "either** ({} ± {} and {} ± {} points) — {}% noise costs this softmax-regression FedAvg nothing measurable on "
      "{} FashionMNIST samples", f"{REMOVAL}, reports/removal/removal.csv",
      lambda r: [*removal(r, "fmnist_label_noise", "removed_flagged"),
                 one_value(r.csv("reports/removal/removal.csv")["n_train"].tolist(), "n_train"),
                 *removal(r, "fmnist_label_noise", "accuracy_before"),
                 *removal(r, "fmnist_label_noise", "accuracy_flagged"),
                 *removal(r, "fmnist_label_noise", "gain_budget", 100),
                 *removal(r, "fmnist_feature_noise", "gain_budget", 100),
                 *removal(r, "fmnist_label_noise", "gain_oracle_removal", 100),
                 *removal(r, "fmnist_feature_noise", "gain_oracle_removal", 100),
                 stage_noise_pct(r), one_value(r.csv("reports/removal/removal.csv")["n_train"].tolist(), "n_train")])


def budget_cis_with_zero(r: Reports) -> str:
    """"every" when the 95% CI of every sweep cell's budget gain includes 0, else how many exclude it."""
    excluding = sum(abs(mean) > ci for mean, ci in (plus_minus(c["Δ budget"]) for c in sweep_cells(r)))
    return "every" if excluding == 0 else f"not every ({excluding} exclude 0)"


def sweep_flagged(r: Reports) -> list[float]:
    """The g > 0 rule on label noise in the sweep: its effect (points; least and most harmful), the share of the
    data it removes (%), its precision (%, lowest and highest) and its AUC at the lowest and highest noise level."""
    table = r.csv(SWEEP_CSV)
    label = table[table["kind"] == "label"]
    label = label.assign(share=label["removed_flagged"] / label["n_train"],
                         precision=label["removed_flagged_noisy"] / label["removed_flagged"])
    cells = label.groupby(["n_train", "noisy"])[["share", "precision", "auc"]].mean().reset_index()
    effects = [plus_minus(c["Δ flagged"])[0] for c in sweep_cells(r, kind="label")]
    at_small = cells[cells["n_train"] == sweep_sizes(r)[0]].sort_values("noisy")
    return [max(effects), min(effects), 100 * cells["share"].mean(), *(100 * v for v in min_max(cells["precision"])),
            at_small["auc"].iloc[0], at_small["auc"].iloc[-1]]


quote("removal sweep", "(`python -m studies.removal_sweep`, `reports/studies/removal_sweep.md`, {} seeds, paired): the "
      "cost (clean − noisy) grows with the noise level — label noise on {} / {} / {}% of {} samples costs "
      "{} ± {} / {} ± {} / {} ± {} points, feature noise {} ± {} / {} ± {} / {} ± {} — and at the paper's {} samples "
      "with {}% noise nothing measurable ({} ± {} label, {} ± {} feature; clean accuracy {}% at {} and {}% at {}: "
      "the model, not the data, limits it). Oracle removal wins the cost back (label {}%: {} ± {}); FedBary's "
      "validation-chosen budget does not ({} to {} points over the {=} cells, {=} CI includes 0); the g > 0 rule "
      "hurts on label noise ({} to {} points; it removes ~{}% of the data at {}–{}% precision, AUC {} → {} as the "
      "noise grows) and helps only on feature noise at {}% ({} ± {})", f"{SWEEP}, {SWEEP_CSV}",
      lambda r: removal_sweep(r))


def sweep_sizes(r: Reports) -> list[int]:
    """The sweep's sample sizes: the stage's, then the paper's."""
    return sorted(int(n) for n in r.csv(SWEEP_CSV)["n_train"].unique())


def removal_sweep(r: Reports) -> list[float | str]:
    small, paper = sweep_sizes(r)
    cells = sweep_cells(r)
    return [r.csv(SWEEP_CSV)["seed"].nunique(), *sweep_levels(r, small), small,
            *(v for c in sweep_cells(r, "label", small) for v in plus_minus(c["Δ clean"])),
            *(v for c in sweep_cells(r, "feature", small) for v in plus_minus(c["Δ clean"])),
            paper, *sweep_levels(r, paper),
            *(v for kind in ("label", "feature") for v in plus_minus(sweep_cells(r, kind, paper)[0]["Δ clean"])),
            plus_minus(sweep_cells(r, n=small)[0]["acc clean"])[0], small,
            plus_minus(sweep_cells(r, n=paper)[0]["acc clean"])[0], paper,
            sweep_levels(r, small)[-1], *plus_minus(sweep_cells(r, "label", small)[-1]["Δ oracle"]),
            *min_max(plus_minus(c["Δ budget"])[0] for c in cells),
            NUMBER_WORDS.get(len(cells), str(len(cells))), budget_cis_with_zero(r),
            *sweep_flagged(r), sweep_levels(r, small)[1],
            *plus_minus(sweep_cells(r, "feature", small)[1]["Δ flagged"])]


quote("duplication", "duplicating a client's whole dataset {}–{}× leaves the exact W and FedBary's estimates unchanged "
      "to ≤ {<=} relative; duplicating one datum {}× moves them", DUPLICATION,
      lambda r: [duplication(r)[key] for key in ("fewest", "most", "change", "datum")])


# --- KNOT text track (reports/teachers/, reports/distill/)
TEACHERS = "reports/teachers/teachers.csv"
SUMMARY = "reports/distill/summary.csv"
CLAIMS = "reports/distill/claims.csv"
GATE = "reports/distill/gate.csv"
TEXT_PARTIES = "reports/partition/text_parties.csv"
TASKS = ("sa", "erc", "nli")
VERDICT_MARKS = {"replicates": "✅", "reversed": "❌", "undecided": "≈", "first better": "▲", "second better": "▼",
                 "uninformative": "∅"}


def teachers(r: Reports, task: str, role: str | None = None) -> pd.DataFrame:
    table = r.csv(TEACHERS)
    return table[(table["task"] == task) & ((table["role"] == role) if role else True)]


def teacher(r: Reports, task: str, party: str, column: str = "test_score") -> float:
    return r.row(TEACHERS, task=task, party=party)[column]


quote("text setting sizes", "(`max_train: null`: SA {} / {} / {}, ERC {} / {} / {}, NLI {} per genre)", TEACHERS,
      lambda r: [*teachers(r, "sa", "local")["n_train"], *teachers(r, "erc", "local")["n_train"],
                 one_value(teachers(r, "nli", "local")["n_train"].tolist(), "NLI local train sizes")])
quote("text setting global", "({}–{} training texts): little labelled", TEACHERS,
      lambda r: min_max(r.csv(TEACHERS)[r.csv(TEACHERS)["role"] == "global"]["n_train"]))
quote("text setting transfer", "SNLI rows the global party does not use (NLI); {} / {} / {} texts;", TEXT_PARTIES,
      lambda r: [r.row(TEXT_PARTIES, task=task, role="transfer")["n"] for task in TASKS])
quote("text setting audit", "*a labelled audit slice* (`audit: 300`): {} transfer texts keep their labels", GATE,
      lambda r: [one_value(r.csv(GATE)["n"].tolist(), "audit slice size")])

for _task in TASKS:
    for _party in ({"sa": ["cell_phones", "musical_instruments", "digital_music", "baby"],
                    "erc": ["dd_chunk1", "dd_chunk2", "meld", "dd_chunk3"],
                    "nli": ["fiction", "government", "slate", "telephone", "travel", "snli"]}[_task]):
        quote(f"gate: {_task}/{_party}", f"| {_task} | {_party} | {{=}} | {{}} ({{}}) | {{}} | {{}} ({{}}) | {{=}} |",
              f"{TEACHERS}, {GATE}",
              lambda r, task=_task, party=_party: [
                  teacher(r, task, party, "role"), teacher(r, task, party), teacher(r, task, party, "majority_score"),
                  *(r.row(GATE, task=task, teacher=party)[c] for c in ("informativeness", "semantic_distance",
                                                                       "sd_constant")),
                  "pass" if r.row(GATE, task=task, teacher=party)["passes"] else "fail"])


def gate_of(r: Reports, task: str, role: str) -> pd.DataFrame:
    table = r.csv(GATE)
    return table[(table["task"] == task) & (table["role"] == role)]


quote("gate: ERC and NLI", "no ERC teacher reaches Spearman {} on DailyDialog's fourth chunk (best {}), and every "
      "NLI model, the global one included, is at chance (Spearman ≤ {<=}, SD no better than a constant)",
      f"params.yaml, {GATE}",
      lambda r: [r.yaml("params.yaml")["distill"]["gate_threshold"],
                 gate_of(r, "erc", "local")["informativeness"].max(),
                 r.csv(GATE)[r.csv(GATE)["task"] == "nli"]["informativeness"].max()])
quote("gate: verdicts", "So **ERC and NLI cannot be tested here**", GATE,
      lambda r: [] if {t: r.row(GATE, task=t, role="global")["task_verdict"] for t in TASKS} == {
          "sa": "testable", "erc": "cannot test here", "nli": "cannot test here"} else ["the gate's verdicts moved"])


def sa_student(r: Reports, variant: str) -> pd.Series:
    return r.row(SUMMARY, task="sa", variant=variant, test_set="ALL")


STUDENT_COLUMNS = ("sd_skill", "informativeness", "expected_label_mean", "expected_label_spread")
quote("students: global", "| global (no distillation) | {} | {} | {} | {} | {} | {} | — |", SUMMARY,
      lambda r: [sa_student(r, "global (no distillation)")[c] for c in ("score", "semantic_distance",
                                                                          *STUDENT_COLUMNS)])
for _variant in ["Sinkhorn-A", "Sinkhorn-D", "Sinkhorn-U", "Sinkhorn-E", "Entropy-A", "Entropy-D", "Entropy-U",
                 "Entropy-E", "Sinkhorn-E-onehot", "Sinkhorn-mixture-A", "Sinkhorn-mixture-E", "Sinkhorn-E-soft",
                 "Entropy-E-soft"]:
    quote(f"students: {_variant}", f"| {_variant} | {{}} ± {{}} | {{}} ± {{}} | {{}} | {{}} | {{}} | {{}} | {{}} |",
          SUMMARY, lambda r, variant=_variant: [sa_student(r, variant)[c] for c in (
              "score", "score_ci95", "semantic_distance", "semantic_distance_ci95", *STUDENT_COLUMNS, "epochs")])


def students_only(r: Reports) -> pd.DataFrame:
    table = r.csv(SUMMARY)
    return table[(table["task"] == "sa") & (table["test_set"] == "ALL") & table["arm"].notna()
                 & (table["arm"] != "")]


quote("students skill", "Every student beats its constant (SD skill {}–{})", SUMMARY,
      lambda r: min_max(students_only(r)["sd_skill"]))
quote("students constant", "1 − SD / the best constant's SD ({}: predicting 3 stars)", SUMMARY,
      lambda r: [one_value(r.csv(SUMMARY)[(r.csv(SUMMARY)["task"] == "sa")]["sd_constant"].tolist(),
                           "SA best constant")])
quote("students seeds", "**SA students** — mean ± 95% CI over {} paired seeds", SUMMARY,
      lambda r: [students_only(r)["seeds"].max()])


def comparison(r: Reports, claim: str, metric: str) -> pd.Series:
    return r.row(CLAIMS, task="sa", test_set="ALL", claim=claim, metric=metric)


CPU_NOISE = "reports/studies/cpu_noise.csv"


def within_cpu_noise(r: Reports, claim: str, metric: str) -> bool:
    """Whether the ALL-set verdict of ``claim`` flips when the text track is recomputed on other float kernels
    (``python -m studies.cpu_noise``); the study's committed verdict must be the claims table's."""
    row = r.row(CPU_NOISE, task="sa", test_set="ALL", claim=claim, metric=metric)
    assert row["verdict"] == comparison(r, claim, metric)["verdict"], \
        f"{CPU_NOISE} is stale for {claim} / {metric}: rerun python -m studies.cpu_noise"
    return bool(row["within_cpu_noise"])


def comparison_row(r: Reports, claim: str) -> list[float | str]:
    values: list[float | str] = [comparison(r, claim, "score")["arm"]]
    for metric in ("score", "semantic_distance"):
        row = comparison(r, claim, metric)
        mark = VERDICT_MARKS[row["verdict"]] + ("†" if within_cpu_noise(r, claim, metric) else "")
        values += [mark, row["mean_difference"], row["ci95"]]
    return values


for _claim in ["Sinkhorn-A vs Entropy-A", "Sinkhorn-D vs Entropy-D", "Sinkhorn-U vs Entropy-U",
               "Sinkhorn-E vs Entropy-E", "Sinkhorn-E vs Sinkhorn-A", "Sinkhorn-E vs Sinkhorn-D",
               "Sinkhorn-E vs Sinkhorn-U", "Entropy-E vs Entropy-A", "Entropy-E vs Entropy-D",
               "Entropy-E vs Entropy-U", "Sinkhorn-E vs Sinkhorn-E-onehot", "Sinkhorn-mixture-A vs Entropy-A",
               "Sinkhorn-mixture-A vs Sinkhorn-A", "Sinkhorn-mixture-E vs Entropy-E", "Sinkhorn-mixture-E vs Sinkhorn-E",
               "Sinkhorn-E-soft vs Sinkhorn-A", "Sinkhorn-E-soft vs Sinkhorn-E", "Entropy-E-soft vs Entropy-A",
               "Entropy-E-soft vs Entropy-E", *(f"{v} vs global" for v in (
                   "Sinkhorn-A", "Sinkhorn-D", "Sinkhorn-U", "Sinkhorn-E", "Entropy-A", "Entropy-D", "Entropy-U",
                   "Entropy-E"))]:
    quote(f"comparison: {_claim}", f"| {{=}} | {_claim} | {{=}} {{}} ± {{}} | {{=}} {{}} ± {{}} |",
          f"{CLAIMS}, {CPU_NOISE}", lambda r, claim=_claim: comparison_row(r, claim))


def cpu_noise_counts(r: Reports) -> list[float]:
    table = r.csv(CPU_NOISE)
    everywhere = table[table["test_set"] == "ALL"]
    return [int(everywhere["within_cpu_noise"].sum()), len(everywhere), int(table["within_cpu_noise"].sum()),
            len(table)]


quote("CPU noise", "† within CPU noise: the verdict flips when the text track is recomputed on other float kernels "
      "({} of these {} verdicts, {} of all {} in `claims.csv`", CPU_NOISE, cpu_noise_counts)


def sd_difference(r: Reports, claim: str) -> float:
    return comparison(r, claim, "semantic_distance")["mean_difference"]


def sd_with_ci(r: Reports, claim: str) -> list[float]:
    row = comparison(r, claim, "semantic_distance")
    return [row["mean_difference"], row["ci95"]]


quote("Sinkhorn vs Entropy", "*fails* for eq. 3 as written with A, D and E (SD higher by {}, {}, {}), replicates "
      "only with U ({})", CLAIMS,
      lambda r: [sd_difference(r, f"Sinkhorn-{w} vs Entropy-{w}") for w in "ADEU"])
quote("mixture arm", "lowers SD against eq. 3's Sinkhorn (A {}, E {}) and lands with Entropy (A {} ± {}, E {} ± {}: "
      "undecided)", CLAIMS,
      lambda r: [sd_difference(r, "Sinkhorn-mixture-A vs Sinkhorn-A"), sd_difference(r, "Sinkhorn-mixture-E vs Sinkhorn-E"),
                 *sd_with_ci(r, "Sinkhorn-mixture-A vs Entropy-A"), *sd_with_ci(r, "Sinkhorn-mixture-E vs Entropy-E")])
quote("soft bias", "E lowers SD against A for both losses (Sinkhorn {}, Entropy {}) and against argmax-E ({}, {})",
      CLAIMS, lambda r: [sd_difference(r, f"{loss}-E-soft vs {loss}-{w}") for w in "AE"
                         for loss in ("Sinkhorn", "Entropy")])
quote("one-hot", "undecided on SD ({} ± {})", CLAIMS, lambda r: sd_with_ci(r, "Sinkhorn-E vs Sinkhorn-E-onehot"))


def distillation(r: Reports) -> list[float | str]:
    table = r.csv(CLAIMS)
    rows = table[(table["task"] == "sa") & (table["test_set"] == "ALL") & (table["arm"] == "distillation")]
    score = rows[rows["metric"] == "score"]
    up = score[score["verdict"] == "replicates"]
    sd = rows[rows["metric"] == "semantic_distance"]
    raised = sd[sd["verdict"] == "reversed"]
    return [len(up), len(score), *min_max(up["mean_difference"]),
            sd_difference(r, "Sinkhorn-U vs global"), len(raised), *min_max(raised["mean_difference"])]


quote("distillation", "macro-F1 yes for {} of {} students ({} to {}), SD *no*: only Sinkhorn-U lowers it ({}), "
      "Entropy-U ties and the other {=} raise it by {}–{}", CLAIMS,
      lambda r: [*distillation(r)[:5], NUMBER_WORDS[distillation(r)[5]], *distillation(r)[6:]])
quote("distillation spread", "spread less across the true labels than the global model's ({}–{} against {})", SUMMARY,
      lambda r: [*min_max(students_only(r)[students_only(r)["arm"] == "replication"]["expected_label_spread"]),
                 sa_student(r, "global (no distillation)")["expected_label_spread"]])


quote("soft bias example", "musical_instruments' mean softmax on random texts is near uniform (largest share {}, "
      "`bias_soft.md`) while its argmax bias puts {} on one label", "reports/bias/bias_soft.csv, reports/bias/bias.csv",
      lambda r: [r.row("reports/bias/bias_soft.csv", task="sa", party="musical_instruments")["max_share"],
                 r.row("reports/bias/bias.csv", task="sa", party="musical_instruments")["max_share"]])

TARGETS = "reports/studies/knot_targets.csv"


def target(r: Reports, kind: str, name: str) -> float:
    return r.row(TARGETS, task="sa", kind=kind, name=name)["spread"]


quote("targets", "musical_instruments' and digital_music's expected labels spread {} and {} across the true labels, "
      "against {} (cell_phones) and {} (the global model), so the teachers' mixture spreads {} under A (D {}, E {}) "
      "— flatter targets than the global model's own predictions; U, which down-weights undecided predictions, "
      "keeps {}", TARGETS,
      lambda r: [target(r, "teacher", t) for t in ("musical_instruments", "digital_music", "cell_phones", "baby")]
      + [target(r, "mixture", w) for w in "ADEU"])


# --- Benchmarks (reports/bench/)
quote("FedWaD speed setting", "times approximate FedWaD (S = {}, K = {}, d = {}, ratio 1:{}) for n = {} … {} per "
      "client",
      SPEED,
      lambda r: [one_value(r.csv(SPEED)[column].tolist(), column) for column in ("support", "iterations", "dim")]
      + [round((r.csv(SPEED)["n"] / r.csv(SPEED)["n_nu"]).mean()), *min_max(r.csv(SPEED)["n"])])
for _n in (3000, 10000, 20000):
    quote(f"FedWaD speed n={_n}", f"| {_n:,} | {{}} s | {{}} s | {{}} s | {'**{}×**' if _n == 20000 else '{}×'} | "
          "{}% / {}% |", SPEED,
          lambda r, n=_n: [speed(r, n, "seconds_exact"), speed(r, n, "seconds_auto"),
                           speed(r, n, "seconds_network_simplex"), speed(r, n, "speedup_vs_network_simplex"),
                           100 * speed(r, n, "rel_error_auto"), 100 * speed(r, n, "rel_error_network_simplex")])
quote("FedWaD speed goal", "): met — {}×, identical error.", SPEED,
      lambda r: [speed(r, r.csv(SPEED)["n"].max(), "speedup_vs_network_simplex")])


def fit(r: Reports, target: str, support: int, column: str = "slope_s_per_client") -> float:
    return r.row(SCALING_FIT, target=target, support=support, clock="wall")[column]


SHAPLEY = "reports/bench/fedbary_scaling_shapley.csv"
SCALING_LOADED = "reports/bench/fedbary_scaling.csv"
quote("FedBary scaling", "FedBary (K = {}) on FashionMNIST clients of {} samples (PCA-32, label-augmented to 96-D), "
      "clients evaluated one after another, BLAS on one thread. {} clients with barycenter support {}: **{} s** with "
      "a validation target, **{} s** with the federated barycenter (goal < 10 min: met). Time is linear in the "
      "number of clients: {} s/client (validation) and {} s/client (barycenter) at S = 500, {} / {} s/client at "
      "S = 100, R² ≥ {>=} for every line. Exact Shapley of the FedAvg utility: {} s for {} clients, {} s for {} "
      "(2¹⁰ coalitions); beyond that only extrapolated. With OpenBLAS's default two threads on a loaded machine the "
      "same sweep took {}–{} s at {} clients", f"{SCALING}, {SCALING_FIT}, {SHAPLEY}, {SCALING_LOADED}",
      lambda r: [one_value(r.csv(SCALING)["iterations"].tolist(), "K"), *largest_scaling_run(r)[1:2],
                 *largest_scaling_run(r)[::2], scaling_seconds(r, "validation"), scaling_seconds(r, "barycenter"),
                 fit(r, "validation", 500), fit(r, "barycenter", 500), fit(r, "validation", 100),
                 fit(r, "barycenter", 100), r.csv(SCALING_FIT).query("clock == 'wall'")["r2"].min(),
                 *shapley_measured(r),
                 *min_max(r.csv(SCALING_LOADED).query("clients == clients.max() and support == support.max()")[
                     "seconds"]), r.csv(SCALING_LOADED)["clients"].max()])


def shapley_measured(r: Reports) -> list[float]:
    """Seconds and clients of the exact-Shapley runs that were measured (not extrapolated), fewest clients first."""
    table = r.csv(SHAPLEY)
    measured = table[table["measured"].astype(str) == "True"].sort_values("clients")
    if len(measured) != 2:
        raise LookupError(f"{SHAPLEY}: {len(measured)} measured runs; the README quotes 2")
    return [v for _, row in measured.iterrows() for v in (row["shapley_seconds"], row["clients"])]


quote("coresets vs users", "**Coresets vs users** (`python -m studies.coreset_users`, `reports/studies/coreset_users.md`, "
      "{} min): FedWaD fig. 5 / 12 at {}, {} and {} clients on a fixed pool of {} MNIST rows", USERS_CSV,
      lambda r: [r.md_number(USERS, r"— ([\d.]+) min on"), *sorted(users_csv(r)["n_clients"].unique()),
                 one_value(users_csv(r)["rows_used"].tolist(), "rows")])
quote("noise vs removal", "**Noise vs removal** (`python -m studies.removal_sweep`, `reports/studies/removal_sweep.md`, "
      "{} min): FedBary table 4 over noise levels ({} / {} / {}%, label and feature) and sizes ({} and the paper's "
      "{} samples), {} paired seeds", f"{SWEEP}, {SWEEP_CSV}",
      lambda r: [r.md_number(SWEEP, r"— ([\d.]+) min on"), *sweep_levels(r, sweep_sizes(r)[0]),
                 *sorted(r.csv(SWEEP_CSV)["n_train"].unique()), r.csv(SWEEP_CSV)["seed"].nunique()])

STEP = "reports/bench/distill_step.csv"
BACKENDS = "reports/bench/sinkhorn_backends.csv"
LOSS = "reports/bench/distill_loss.csv"


def setting(r: Reports, path: str, key: str) -> float:
    """``key=value`` from the ``setting`` column a bench writes (the same in every row)."""
    found = {match.group(1) for text in r.csv(path)["setting"] if (match := re.search(rf"\b{key}=(\d+)", text))}
    if len(found) != 1:
        raise LookupError(f"{path}: {key} in the setting column is {sorted(found)}")
    return float(found.pop())


def step(r: Reports, batch: int, kind: str, eps: float | None = None) -> pd.Series:
    table = r.csv(STEP)
    rows = table[(table["batch"] == batch) & (table["kind"] == kind)
                 & ((table["eps"] == eps) if eps is not None else table["eps"].isna())]
    if len(rows) != 1:
        raise LookupError(f"{STEP}: {len(rows)} rows for batch {batch}, {kind}, ε={eps}")
    return rows.iloc[0]


EPSILONS = (0.1, 0.01, 0.001)


def step_quotes(r: Reports) -> list[float]:
    values = [setting(r, STEP, "K"), setting(r, STEP, "seq")]
    for batch in sorted(r.csv(STEP)["batch"].unique()):
        values += [batch, step(r, batch, "kl")["step_median_s"],
                   *(step(r, batch, "sinkhorn", eps)["ratio_vs_kl"] for eps in EPSILONS)]
        if batch == min(r.csv(STEP)["batch"]):
            values += list(EPSILONS)
    for batch in sorted(r.csv(STEP)["batch"].unique()):
        values += min_max([step(r, batch, "sinkhorn", eps)["loss_overhead_s"] for eps in EPSILONS])
    return values


quote("distill step", "eq. 3 over K = {} teachers, backward, Adam — with the default BERT-tiny-shaped student ({} "
      "tokens), Sinkhorn (the default solver, `newton`) and KL interleaved in one run: at batch {}, KL {} s median "
      "and Sinkhorn / KL = **{} / {} / {}** at ε = {} / {} / {}; at batch {}, KL {} s and **{} / {} / {}** (the loss "
      "itself adds {}–{} s and {}–{} s)", STEP, step_quotes)


def backends(r: Reports) -> list[float]:
    table = r.csv(BACKENDS)
    fixed = table[table["backend"] == "fixed"].set_index(["batch", "eps"])["seconds_median"]
    newton = table[table["backend"] == "newton"].set_index(["batch", "eps"])["seconds_median"]
    return [table[table["backend"] == "fixed"]["max_abs_error_vs_pot"].max(), *min_max(fixed / newton),
            *(1000 * v for v in min_max(fixed)), *(1000 * v for v in min_max(newton)), *min_max(table["batch"]),
            setting(r, BACKENDS, "K")]


quote("Sinkhorn backends", "(values within {<=} of POT; `python -m bench.sinkhorn_backends`, "
      "`reports/bench/sinkhorn_backends.md`): on this CPU it is {}–{}× slower per call than `newton` ({}–{} ms "
      "against {}–{} ms for {}–{} samples × {} teachers)", BACKENDS, backends)


def loss_rows(r: Reports, method: str, eps_at_most: float = 1.0) -> pd.DataFrame:
    table = r.csv(LOSS)
    return table[(table["method"] == method) & (table["eps"] <= eps_at_most)]


def loss_quotes(r: Reports) -> list[float]:
    otfed = "otfed newton, batched, fwd+bwd"
    pot = "POT sinkhorn2 sinkhorn_log, per pair, fwd"
    authors = "geomloss scaling 0.5, batched, fwd"
    return [setting(r, LOSS, "B"), setting(r, LOSS, "K"), setting(r, LOSS, "C"),
            *min_max(loss_rows(r, otfed)["seconds"]), loss_rows(r, otfed, 0.01)["max_abs_error_vs_w1"].max(),
            loss_rows(r, otfed)["max_abs_error_vs_entropic"].max(),
            *min_max(loss_rows(r, pot)["seconds"]), loss_rows(r, pot)["max_abs_error_vs_w1"].max(),
            *min_max(loss_rows(r, "geomloss scaling 0.5, per pair, fwd")["seconds"]),
            *min_max(loss_rows(r, authors)["seconds"]), loss_rows(r, authors)["max_abs_error_vs_w1"].max()]


quote("distill loss", "The loss alone for {} × {} teachers × {} labels (one thread, forward + backward): otfed {}–{} s "
      "with error ≤ {<=} to the exact W1 at ε ≤ 0.01 and ≤ {<=} to POT run to convergence; POT's `sinkhorn2` called "
      "per pair with default settings {}–{} s (it stops unconverged on some pairs, error up to {}); geomloss per "
      "pair {}–{} s, and batched as the authors call it {}–{} s but with errors up to {} against W1", LOSS,
      loss_quotes)


# ----------------------------------------------------------------------------------------------------------------
# the tests


@pytest.fixture(scope="module")
def readme() -> Text:
    return Text.pages()


@pytest.fixture(scope="module")
def reports() -> Reports:
    return Reports(REPO)


@pytest.mark.parametrize("quote", QUOTES, ids=[quote.name for quote in QUOTES])
def test_the_readme_says_what_the_committed_reports_hold(quote: Quote, readme: Text, reports: Reports) -> None:
    found = problems(quote, readme, reports)
    assert not found, "\n".join(found)


def test_quote_names_are_unique() -> None:
    names = [quote.name for quote in QUOTES]
    assert len(names) == len(set(names)), sorted({name for name in names if names.count(name) > 1})


def changed_last_digit(number: str) -> str:
    """``number`` with its last digit moved by one (9 → 8): one unit of the README's rounding away."""
    index = max(i for i, char in enumerate(number) if char.isdigit() and "e" not in number[:i])
    digit = int(number[index])
    return number[:index] + str(digit - 1 if digit == 9 else digit + 1) + number[index + 1:]


def test_every_quoted_number_is_checked(readme: Text, reports: Reports) -> None:
    """A README number one unit off (or another word) fails its quote, naming the README line and both values —
    so no quote passes whatever the README says. Bounds (≤, ≥) are left out: a looser bound stays true."""
    for quote in QUOTES:
        values = read_values(quote, reports)
        match = quote.pattern().search(readme.flat)
        assert match is not None, f"quote {quote.name!r}: passage not in {', '.join(PAGES)}"
        for group, kind in enumerate(quote.slots(), start=1):
            if kind in ("<=", ">="):
                continue
            old = match.group(group)
            new = changed_last_digit(old) if kind == "" else old + "X"
            start, end = match.span(group)
            changed = Text(readme.flat[:start] + new + readme.flat[end:])
            found = compare(quote, changed, values)
            assert any(f"says {new} " in line for line in found), (quote.name, old, new, found)


def test_a_changed_report_value_fails_the_quotes_that_read_it(readme: Text) -> None:
    """The values come from the reports at test time: FedWaD's timings 10% slower fail the quotes of them."""
    committed, changed = Reports(REPO), Reports(REPO)
    speed = committed.csv(SPEED).copy()
    speed["seconds_exact"] *= 1.1
    changed.tables[SPEED] = speed
    found = {quote.name: problems(quote, readme, changed) for quote in QUOTES}
    failing = sorted(name for name, lines in found.items() if lines and not problems(
        next(q for q in QUOTES if q.name == name), readme, committed))
    assert failing == ["FedWaD speed n=10000", "FedWaD speed n=20000", "FedWaD speed n=3000",
                       "claims: FedWaD speed"], failing
    assert all(SPEED in line and "says" in line for name in failing for line in found[name])


def test_a_missing_report_is_named(readme: Text, tmp_path: Path) -> None:
    found = problems(next(q for q in QUOTES if q.name == "claims: FedWaD speed"), readme, Reports(tmp_path))
    assert len(found) == 1 and SPEED in found[0] and "FileNotFoundError" in found[0], found


def test_leaves_counts_every_scalar_of_a_metrics_document() -> None:
    """What `dvc metrics show --json` lists per metrics file: every scalar, nested or in a list."""
    assert leaves({"a": {"b": 1, "c": [2, 3]}, "d": "x", "e": None}) == 5
    assert leaves({}) == 0


def listing(text: Text, reports: Reports) -> Iterator[str]:
    """Every quoted number: ok / FAIL, README line, README value, kind (~ equal, <=, >=, =), report value."""
    for quote in QUOTES:
        try:
            values = read_values(quote, reports)
        except LookupError as error:
            yield f"FAIL {error}"
            continue
        match = quote.pattern().search(text.flat)
        if match is None:
            yield f"FAIL {compare(quote, text, values)[0]}"
            continue
        for group, (kind, value) in enumerate(zip(quote.slots(), values), start=1):
            said = match.group(group)
            shown = value if isinstance(value, str) else f"{float(value):.6g}"
            yield (f"{'ok  ' if agrees(kind, said, value) else 'FAIL'} {text.where(match.start(group))} "
                   f"{said} {kind or '~'} {shown}  [{quote.name}; {quote.source}]")


if __name__ == "__main__":
    print("\n".join(listing(Text.pages(), Reports(REPO))))
