"""One offline results page: otfed's tables and figures next to the papers' numbers.

``python -m flows.results [--out reports/index.html] [--reports reports]`` reads what the stages wrote under
``reports/`` (CSV tables, PNG figures, ``metrics.json``) and writes one HTML page: for FedWaD, FedBary and KNOT,
each table / figure the pipeline reproduces, with the paper's numbers (``flows.paper_numbers``) beside otfed's,
and each stage's headline metrics (``Stage.headline``). Plain HTML and CSS: no script, no stylesheet or font
from the network; figures are referenced by relative path (the page opens from ``reports/`` and is small).
A stage whose outputs are missing gets "not run yet (dvc repro <stage>)". The page is committed and must come out
byte for byte the same from the same reports: it names no time, commit, run id or absolute path, and reads no
wall time from the stages' reports (they hold none; timings come from the benchmarks' tables, ``reports/bench``).
"""
from __future__ import annotations

import argparse
import html
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

from flows.paper_numbers import KNOT_ALL, PAPERS
from stages.params import stages
from stages.stage import headline_metrics

# ------------------------------------------------------------------------------------------- views
# A view turns one stage's report folder into the small tables the page shows: [(caption, frame)].
# FileNotFoundError → "not run yet"; any other error is shown on the page (the page is still written).
View = Callable[[Path], list[tuple[str, pd.DataFrame]]]
VIEWS: dict[str, View] = {}


def view(fn: View) -> View:
    VIEWS[fn.__name__] = fn
    return fn


def _csv(folder: Path, name: str) -> pd.DataFrame:
    path = folder / name
    if not path.exists():
        raise FileNotFoundError(path)
    return pd.read_csv(path)


@view
def toy_error_at_max_n(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "toy_gaussians.csv")
    approx = rows[rows.method == "fedwad_approx"]
    n = int(approx.n.max())
    at = approx[approx.n == n].groupby(["dim", "ratio", "support"], as_index=False).rel_error.mean()
    at["setting"] = [f"d = {d}, ratio 1:{r}" for d, r in zip(at.dim, at.ratio)]
    table = at.pivot(index="setting", columns="support", values="rel_error")
    table.columns = [f"S = {s}" for s in table.columns]
    return [(f"approximate FedWaD: relative error |est − W| / W at n = {n:,} (mean over repeats)",
             table.reset_index())]


@view
def toy_error_at_largest_exact_n(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "toy_gaussians.csv")
    exact_interp = rows[rows.method == "fedwad_exact_interp"].dropna(subset=["rel_error"])
    if exact_interp.empty:
        return []
    n = int(exact_interp.n.max())
    at = rows[(rows.n == n) & (rows.ratio == 1) & (rows.method != "exact_ot")]
    at = at.assign(method=[m if m != "fedwad_approx" else f"fedwad_approx S={s}" for m, s in zip(at.method, at.support)])
    table = at.pivot_table(index="method", columns="dim", values="rel_error", sort=False)
    table.columns = [f"d = {d}" for d in table.columns]
    return [(f"relative error at n = {n}, ratio 1:1 — the largest n exact-interpolation FedWaD ran at (mean over "
             "repeats)", table.reset_index())]


@view
def fedwad_speed(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "fedwad_speed.csv")
    cols = [c for c in ("n", "n_nu", "seconds_exact", "seconds_auto", "seconds_network_simplex",
                        "speedup_vs_network_simplex", "rel_error_auto", "rel_error_network_simplex") if c in rows]
    setting = ", ".join(f"{label} = {int(rows[c].iloc[0])}" for c, label in
                        (("support", "S"), ("iterations", "iterations"), ("dim", "d")) if c in rows)
    return [(f"wall time (s) of the exact W2 and of approximate FedWaD (seconds_auto: otfed's subproblem solver; "
             f"seconds_network_simplex: POT's network simplex for every subproblem) vs n (ν: n_nu samples), "
             f"{setting} (bench, one run)", rows[cols])]


@view
def convergence_final_gap(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "convergence.csv")
    last = rows.sort_values("iteration").groupby(["dim", "setting"], as_index=False).last()
    best = rows.groupby(["dim", "setting"], as_index=False).rel_gap.min()
    best = best.rename(columns={"rel_gap": "min A(k)/W − 1"})
    table = last[["dim", "setting", "n", "iteration", "rel_gap"]].rename(
        columns={"iteration": "last k", "rel_gap": "final A(k)/W − 1"}).merge(best, on=["dim", "setting"])
    return [("A(k)/W − 1 after the last iteration and its minimum over k", table)]


@view
def otdd_pairs(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "otdd_pairs.csv")
    rows = rows[rows.a != rows.b]
    table = rows[["a", "b", "exact", "federated"]].assign(
        rel_error=(rows.federated - rows.exact).abs() / rows.exact)
    return [("pairwise OTDD, exact vs federated (FedWaD)", table.reset_index(drop=True))]


@view
def clustering_ari(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "clustering_ari.csv")
    table = rows.pivot(index="federation", columns="method", values="ari").reset_index()
    return [("adjusted Rand index of the spectral clustering vs the planted client groups (1 = perfect)", table)]


@view
def contributions(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "contributions_wide.csv")
    return [("contribution (%) of each client per method (FedBary: inverse distance share)", rows)]


def _with_ci(rows: pd.DataFrame, value: str) -> pd.Series:
    """'mean ± half-width' strings (the half-width column ``<value>_ci95``; just the mean when it is NaN)."""
    half = rows.get(f"{value}_ci95", pd.Series(np.nan, index=rows.index))
    return pd.Series([f"{m:.3g}" if not np.isfinite(h) else f"{m:.3g} ± {h:.2g}" for m, h in zip(rows[value], half)],
                     index=rows.index)


@view
def method_agreement(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "method_agreement.csv")
    out = []
    for value, what in (("spearman_vs_exact_shapley", "with exact Shapley (FedAvg utility)"),
                        ("spearman_vs_planted", "with the planted noise order (cases 4–5: less noise = more value)")):
        if value not in rows:
            continue
        sub = rows.dropna(subset=[value]).assign(cell=lambda r, v=value: _with_ci(r, v))
        table = sub.pivot(index="federation", columns="method", values="cell").reset_index()
        out.append((f"Spearman rank correlation of each method's client contributions {what}: mean ± 95% CI over "
                    "seeds", table))
    return out


@view
def outlier_distances(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "outlier_distances.csv")
    return [("distance of each client to the target (client_04 has noisy features)",
             rows[[c for c in ("target", "client", "noisy", "distance", "farthest") if c in rows]])]


def _detection(folder: Path, metric: str) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "detection.csv")
    rows = rows.assign(setting=[f"{k} noise {100 * r:g}%" for k, r in zip(rows.kind, rows.rate)])
    table = rows.pivot(index="setting", columns="method", values=metric)
    table = table.reindex(list(dict.fromkeys(rows.setting)))[list(dict.fromkeys(rows.method))]
    return [(f"detection {metric} of the flagged points, per method (FedBary without data access; the others "
             "with it)", table.reset_index())]


@view
def detection_f1(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    return _detection(folder, "f1")


@view
def detection_auc(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "detection.csv")
    return _detection(folder, "auc") if "auc" in rows else []


@view
def detection_recall(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    return _detection(folder, "recall")


@view
def duplication(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "duplication.csv")
    cols = [c for c in ("experiment", "stats", "datum", "copies", "exact_w", "fedbary_validation",
                        "fedbary_barycenter") if c in rows]
    return [("W(P_i, Q) of one client when its dataset (or one datum) is duplicated; stats = original: the same "
             "class statistics, refit: re-estimated on the duplicated rows", rows[cols])]


@view
def removal(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "removal_summary.csv")
    table = rows[["federation", "seeds", "noisy"]].copy()
    for col, label in (("removed_flagged", "#removed (g > 0)"), ("removed_budget", "#removed (budget)"),
                       ("auc", "AUC of g"), ("accuracy_before", "acc. before"),
                       ("accuracy_flagged", "acc. after (g > 0)"), ("accuracy_budget", "acc. after (budget)"),
                       ("accuracy_oracle_removal", "acc. oracle"), ("gain_budget", "gain (budget)"),
                       ("gain_oracle_removal", "gain (oracle)")):
        table[label] = _with_ci(rows, col)
    return [("FedAvg test accuracy before / after removing FedBary's flagged points (g > 0, the paper's rule) or a "
             "validation-chosen budget of the largest g; oracle = exactly the noisy points; mean ± 95% CI over seeds",
             table)]


@view
def clustered_fl(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "clustered_fl.csv")
    table = rows[["federation", "clustering", "algorithm"]].assign(
        accuracy=_with_ci(rows, "accuracy"), uplift_vs_global_fedavg=_with_ci(rows, "uplift_vs_global_fedavg"))
    return [("pooled held-out accuracy of FL trained globally or within the federated-OTDD clusters (affinity); "
             "mean ± 95% CI over seeds; uplift paired by seed", table)]


@view
def coresets(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "coresets.csv")
    table = rows[["federation", "method"]].assign(accuracy=_with_ci(rows, "accuracy"))
    return [("pooled held-out accuracy of the 1-NN classifier over every client's coreset (K points per client) "
             "next to global FedAvg / FedPer / FedRep on the same splits; mean ± 95% CI over seeds", table)]


def _privacy_attack_rows(folder: Path) -> pd.DataFrame:
    """The attack rows under the papers' defences: approximate interpolation, distances only at the end (FedBary:
    the d_i it sends every round), the largest K; ``setting`` names protocol, t and FedBary's Q."""
    rows = _csv(folder, "privacy_attack.csv").astype({"support": str, "t": str})
    k = rows.iterations.max()
    rows = rows[(rows.interpolation == "approx") & (rows.iterations == k)
                & ((rows.distances == "last") | (rows.protocol == "fedbary"))]
    return rows.assign(setting=[f"{p}, t {t}" + (", Q = validation set" if v else "")
                                for p, t, v in zip(rows.protocol, rows.t, rows.validation)])


def _by_support(rows: pd.DataFrame) -> pd.DataFrame:
    table = rows.pivot_table(index="setting", columns="support", values="recovered_fraction", sort=False)
    base = rows.groupby("support", sort=False).non_member_fraction.mean().rename("non-members (baseline)")
    table = pd.concat([table, base.to_frame().T])
    table.columns = [f"S = {s}" for s in table.columns]
    return table.rename_axis("setting").reset_index()


@view
def privacy_attack(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _privacy_attack_rows(folder)
    k = int(rows.iterations.max())
    return [(f"fraction of the target client's samples an honest-but-curious server recovers from the messages "
             f"(within 0.5 × their median NN distance), approximate interpolation, distances only at the end, "
             f"K = {k}; n = the target's sample count; mean over targets and seeds (reports/fed_distance/"
             "privacy_attack.md: every cell, and what it says about each statement)", _by_support(rows))]


@view
def privacy_attack_fedbary(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _privacy_attack_rows(folder)
    rows = rows[rows.protocol == "fedbary"]
    return [("FedBary: fraction of the target client's raw samples the server recovers from γ, d and η messages "
             "(Q the federated barycenter, or the server's validation set); mean over targets and seeds",
             _by_support(rows))] if len(rows) else []


@view
def privacy_dp(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "privacy_dp.csv").astype({"support": str, "t": str})
    rows = rows.assign(setting=[f"S = {s}, t {t}" for s, t in zip(rows.support, rows.t)])
    out = []
    for value, what in (("recovered_fraction", "fraction of the target's samples the attack recovers"),
                        ("rel_error", "relative error |estimate − W2| / W2 of DP FedWaD")):
        table = rows.pivot_table(index="epsilon", columns="setting", values=value, sort=False).sort_index()
        out.append((f"DP FedWaD, both clients (ε, δ = {rows.delta.iloc[0]:g})-DP: {what} vs ε per client "
                    "(inf: no noise); mean over targets and seeds", table.reset_index()))
    base = rows.groupby(["setting"], sort=False)[["non_member_fraction", "fedwad_rel_error"]].mean()
    out.append(("per setting: the attack's non-member baseline and the non-DP FedWaD error",
                base.rename(columns={"non_member_fraction": "non-members recovered",
                                     "fedwad_rel_error": "non-DP FedWaD rel. error"}).reset_index()))
    path = folder / "privacy_dp_clustering.csv"
    if path.exists():
        clustering = pd.read_csv(path)
        table = clustering.pivot_table(index="epsilon", columns="method", values="ari", sort=False).sort_index()
        out.append((f"spectral clustering of {int(clustering.clients.iloc[0])} clients on pairwise DP FedWaD: "
                    "ARI vs the planted groups per ε", table.reset_index()))
    return out


@view
def privacy_dp_fedbary(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "privacy_dp_detection_summary.csv")
    out = []
    for value, what in (("auc", "detection ROC AUC of the datum values"),
                        ("distance_rel_error", "closing distances' mean relative error against plain FedBary")):
        table = rows.pivot_table(index="epsilon", columns="kind", values=value, sort=False)
        out.append((f"DP FedBary, every client (ε, δ)-DP: {what} per total ε per client (no DP: plain FedBary; "
                    "inf: clipping, no noise); mean over seeds (privacy_dp_detection_summary.csv: ± 95% CI)",
                    table.reset_index()))
    return out


@view
def fedbary_scaling(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "fedbary_scaling_blas1.csv")
    table = rows.pivot_table(index="clients", columns=["target", "support"], values="seconds")
    table.columns = [f"{t}, S={s} (s)" for t, s in table.columns]
    out = [("FedBary wall time (s) vs clients (bench, BLAS on one thread)", table.reset_index())]
    fit = folder / "fedbary_scaling_blas1_fit.csv"
    if fit.exists():
        out.append(("linear fit: seconds per client", pd.read_csv(fit)))
    return out


@view
def teachers(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "teachers.csv")
    cols = [c for c in ("task", "party", "role", "model", "n_train", "best_epoch", "score", "test_score") if c in rows]
    return [("test score of every party's model (macro-F1; NLI accuracy)", rows[cols])]


@view
def bias(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    rows = _csv(folder, "bias.csv")
    return [("largest label share of each teacher's B_k", rows[["task", "party", "majority_label", "max_share"]])]


@view
def distill_gate(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    """The gate on the audit slice: per teacher its Spearman with the truth and SD against the best constant."""
    gate = _csv(folder, "gate.csv")
    return [("the gate (reports/distill/gate.csv): does each teacher read its texts on the labelled audit slice "
             "(Spearman ≥ 0.3), does the global model beat the best constant — and the task's verdict",
             gate[["task", "teacher", "role", "informativeness", "semantic_distance", "sd_constant", "passes",
                   "task_verdict"]])]


@view
def distill_all(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    """The ALL column of ``table_<task>.csv`` for every task, in the paper's layout (variants × task)."""
    columns: dict[str, pd.Series] = {}
    for task in KNOT_ALL:
        path = folder / f"table_{task}.csv"
        if path.exists():
            ours = pd.read_csv(path).set_index("variant")
            columns[f"{task.upper()} score"] = ours["ALL score"]
            columns[f"{task.upper()} SD"] = ours["ALL SD"]
    if not columns:
        raise FileNotFoundError(folder / "table_sa.csv")
    table = pd.DataFrame(columns)
    order = [v for v in KNOT_ALL["sa"] if v in table.index] + [v for v in table.index if v not in KNOT_ALL["sa"]]
    return [("ALL test set of reports/distill/table_<task>.csv (score: macro-F1 for SA and ERC, accuracy for NLI)",
             table.reindex(order).rename_axis("variant").reset_index())]


@view
def distill_claims(folder: Path) -> list[tuple[str, pd.DataFrame]]:
    """The papers' claims on the ALL test sets: paired difference over seeds, its 95% CI and the verdict."""
    claims = _csv(folder, "claims.csv")
    claims = claims[claims.test_set == "ALL"]
    return [("the papers' claims and the mechanism arms as paired differences over seeds (first − second; the papers "
             "claim score ↑ and SD ↓), reports/distill/claims.csv",
             claims[["task", "arm", "claim", "metric", "seeds", "mean_difference", "ci95", "verdict"]])]


# ------------------------------------------------------------------------------------------- page
CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1400px; color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 2px solid #444; margin-top: 2em; }
h3 { margin-top: 1.6em; background: #f0f0f0; padding: 0.3em 0.5em; }
.meta, .note, .caption { color: #555; font-size: 0.9em; }
.pair { display: grid; grid-template-columns: minmax(0, 2fr) minmax(0, 3fr); gap: 1.5em; }
.pair > div { min-width: 0; overflow-x: auto; }
blockquote { margin: 0.4em 0; padding: 0.2em 0.8em; border-left: 3px solid #999; background: #fafafa; }
table.frame { border-collapse: collapse; font-size: 0.85em; margin: 0.3em 0 1em; }
table.frame th, table.frame td { border: 1px solid #ccc; padding: 0.15em 0.5em; text-align: right; }
table.frame th { background: #eee; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.3em 0; }
.missing { color: #a00; font-weight: bold; }
nav ul { columns: 3; }
"""


def _number(x: Any) -> str:
    if isinstance(x, float):
        return "" if x != x else f"{x:.4g}"
    return str(x)


def frame_html(frame: pd.DataFrame) -> str:
    """A table as plain HTML (values escaped, floats to 4 significant digits)."""
    frame = frame.rename_axis(columns=None)  # a pivot's column-index name would print as a header row
    return frame.to_html(index=False, classes="frame", border=0, na_rep="", float_format=_number, escape=True)


def flat(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        out.update(flat(value, name) if isinstance(value, dict) else {name: value})
    return out


def stage_folder(reports: Path, stage_name: str) -> Path:
    """The reports folder of a DVC stage (``Stage.outputs[0]``) under ``reports``."""
    return reports / Path(stages()[stage_name].outputs[0]).name


def not_run(stage_name: str, run: str | None = None) -> str:
    return f'<p class="missing">not run yet ({html.escape(run or f"dvc repro {stage_name}")})</p>'


def headline_html(reports: Path, stage_name: str) -> str:
    """The stage's headline metrics (``Stage.headline`` applied to its ``metrics.json``) as a two-column table."""
    path = stage_folder(reports, stage_name) / "metrics.json"
    if not path.exists():
        return not_run(stage_name)
    selected = flat(headline_metrics(json.loads(path.read_text()), stages()[stage_name].headline))
    frame = pd.DataFrame({"metric": list(selected), "value": list(selected.values())})
    return (f'<p class="caption">headline metrics of stage <code>{html.escape(stage_name)}</code> '
            f'(<code>{html.escape(path.relative_to(reports).as_posix())}</code>, what '
            f"<code>dvc metrics show</code> shows)</p>" + frame_html(frame))


def item_html(item: dict[str, Any], reports: Path, out_dir: Path, anchor: str) -> str:
    folder = reports / item["folder"]
    stage_name, run = item["stage"], item.get("run")
    parts = [f'<h3 id="{anchor}">{html.escape(item["ref"])} — {html.escape(item["title"])}</h3>']
    paper = [f"<blockquote>“{html.escape(q)}”</blockquote>" for q in item.get("quotes", [])]
    if "paper_table" in item:
        t = item["paper_table"]
        paper.append(f'<p class="caption">{html.escape(t["caption"])}</p>'
                     + frame_html(pd.DataFrame(t["rows"], columns=t["columns"])))
    ours: list[str] = []
    if not folder.is_dir():
        ours.append(not_run(stage_name, run))
    else:
        for name in item.get("views", []):
            try:
                for caption, frame in VIEWS[name](folder):
                    ours.append(f'<p class="caption">{html.escape(caption)}</p>' + frame_html(frame))
            except FileNotFoundError as exc:
                missing = Path(str(exc.filename or (exc.args[0] if exc.args else exc))).name
                ours.append(not_run(stage_name, run).replace(
                    "not run yet", f"{html.escape(missing)} missing: not run yet"))
            except Exception as exc:  # a changed table layout: say so on the page, keep the rest
                message = str(exc).replace(str(reports.resolve()), reports.resolve().name)  # no absolute path
                ours.append(f'<p class="missing">could not read this table: {html.escape(type(exc).__name__)}: '
                            f"{html.escape(message)}</p>")
    if not ours and folder.is_dir():
        ours.append("<p>(figures below)</p>")
    if item.get("note"):
        ours.append(f'<p class="note">{html.escape(item["note"])}</p>')
    parts.append('<div class="pair"><div><h4>paper</h4>' + "".join(paper or ["<p>(figure only)</p>"])
                 + '</div><div><h4>otfed</h4>' + "".join(ours) + "</div></div>")
    for fig in item.get("figures", []):
        path = folder / fig
        if path.exists():
            rel = Path(os.path.relpath(path, out_dir)).as_posix()
            parts.append(f'<figure><img src="{html.escape(rel)}" alt="{html.escape(fig)}" loading="lazy">'
                         f'<figcaption class="caption">{html.escape(rel)}</figcaption></figure>')
        elif folder.is_dir():
            parts.append(f'<p class="missing">{html.escape(fig)} missing: not run yet '
                         f'({html.escape(run or f"dvc repro {stage_name}")})</p>')
    return "\n".join(parts)


def page_html(reports: Path, out: Path, papers: Iterable[dict[str, Any]] = PAPERS) -> str:
    """The whole page for the reports tree ``reports``, written to ``out`` (image paths are relative to it).
    A function of the files under ``reports`` only: no date, commit or absolute path (the page is committed)."""
    papers = list(papers)
    out_dir = out.parent
    nav, body = [], []
    body.append('<h2 id="data">Data (stage partition)</h2>')
    fig = reports / "partition" / "class_histograms.png"
    body.append(headline_html(reports, "partition"))
    if fig.exists():
        body.append(f'<figure><img src="{html.escape(Path(os.path.relpath(fig, out_dir)).as_posix())}" '
                    'alt="class histograms" loading="lazy"></figure>')
    nav.append('<li><a href="#data">Data (partition)</a></li>')
    for paper in papers:
        body.append(f'<h2 id="{paper["key"]}">{html.escape(paper["title"])}</h2>')
        body.append(f'<p class="meta">paper: {html.escape(paper["cite"])} (CITATION.cff) — quotes are '
                    "verbatim, with the PDF extraction's garbled math restated in plain text.</p>")
        nav.append(f'<li><a href="#{paper["key"]}">{html.escape(paper["title"].split(" — ")[0])}</a><ul>')
        seen: list[str] = []
        for i, item in enumerate(paper["items"]):
            anchor = f'{paper["key"]}-{i}'
            nav.append(f'<li><a href="#{anchor}">{html.escape(item["ref"])}</a></li>')
            body.append(item_html(item, reports, out_dir, anchor))
            if item["stage"] in stages() and item["stage"] not in seen and item.get("headline", True):
                seen.append(item["stage"])
        nav.append("</ul></li>")
        body.append("<h3>Headline metrics</h3>")
        body.extend(headline_html(reports, s) for s in seen)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<title>otfed — results next to the papers</title>\n"
            f"<style>{CSS}</style>\n</head>\n<body>\n"
            "<h1>otfed — results next to the papers</h1>\n"
            f'<p class="meta">reports: <code>{html.escape(reports.name)}/</code> · regenerate with '
            "<code>python -m flows.results</code> · figures, tables and metrics come from the stages' outputs "
            "(<code>dvc repro</code>); wall times from the benchmarks (<code>make bench</code>), the stages' own "
            "in their MLflow runs</p>\n"
            f"<nav><ul>{''.join(nav)}</ul></nav>\n" + "\n".join(body) + "\n</body>\n</html>\n")


def write_page(reports: str | Path = "reports", out: str | Path | None = None) -> Path:
    """Write the page (atomically: a temporary file renamed into place) and return its path."""
    reports = Path(reports)
    out = reports / "index.html" if out is None else Path(out)
    text = page_html(reports, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m flows.results [--out reports/index.html] [--reports reports]``."""
    parser = argparse.ArgumentParser(prog="python -m flows.results", description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", default="reports", help="the reports folder (default: reports)")
    parser.add_argument("--out", default=None, help="the page to write (default: <reports>/index.html)")
    args = parser.parse_args(argv)
    if not Path(args.reports).is_dir():
        print(f"error: {args.reports}: no such folder (run dvc repro first)", file=sys.stderr)
        return 2
    path = write_page(args.reports, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
