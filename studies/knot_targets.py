"""What the KNOT students are asked to learn (issue #22): the expected label of each teacher and of the teachers'
weighted mixture under every weighting, on the distill stage's labelled audit slice of the transfer set.

The distill stage's gate says whether a teacher reads its texts; this study asks why the students' expected
labels spread less across the true labels than the global model's own: a teacher whose expected label barely
moves with the truth flattens the targets eq. 3 averages. Per task that passes the gate, from the committed
pipeline's messages (``data/text_messages``, ``data/text_bias``) and audit labels (``data/text_partitions``):
each teacher's and each weighting's mixture Σ_k W̄_k h_k(x) — its mean expected label, the spread of the
per-true-label means (largest minus smallest in 1-D), and Spearman with the truth
(:mod:`otfed.distill.diagnostics`). Labels are read for this diagnosis only.

    python -m studies.knot_targets
Results: reports/studies/knot_targets.{csv,md}.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from otfed import io
from otfed.data.text.store import load_text_federation
from otfed.distill.diagnostics import expected_label_profile, informativeness
from otfed.distill.student import ensemble_weights
from otfed.distill.weights import WEIGHTINGS
from otfed.federation.knot import load_messages, server_ensemble
from otfed.label_space import LabelSpace

PARTITIONS = Path("data/text_partitions")
MESSAGES = Path("data/text_messages")
BIASES = Path("data/text_bias")
OUT = Path("reports/studies")


def target_rows(task: str) -> list[dict]:
    """One row per teacher and per weighting's mixture of ``task``, profiled on its audit slice."""
    fed = load_text_federation(PARTITIONS / task)
    space = LabelSpace.for_task(task)
    ensemble = server_ensemble(load_messages(MESSAGES / f"{task}.npz") + load_messages(BIASES / f"{task}.npz"),
                               [q.name for q in fed.locals], fed.global_party.name)
    audit, labels = fed.audit_index, fed.audit_labels
    q = ensemble.probabilities[audit]

    def row(kind: str, name: str, probs: np.ndarray) -> dict:
        profile = expected_label_profile(probs, labels, space)
        return dict(task=task, kind=kind, name=name, n=len(labels), mean=profile["mean"],
                    spread=profile["spread"], spearman=informativeness(probs, labels, space))

    rows = [row("teacher", name, q[:, k]) for k, name in enumerate(ensemble.names)]
    for weighting in WEIGHTINGS:
        w = ensemble_weights(ensemble, weighting)[audit]
        w = w / w.sum(axis=1, keepdims=True)
        rows.append(row("mixture", weighting, (w[..., None] * q).sum(axis=1)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["sa"], help="tasks (those that pass the gate)")
    args = parser.parse_args(argv)
    table = pd.DataFrame([r for task in args.tasks for r in target_rows(task)])
    OUT.mkdir(parents=True, exist_ok=True)
    io.write_csv(table.round(4), OUT / "knot_targets.csv")
    header = ("# KNOT: what the students are asked to learn\n\n"
              f"`python -m studies.knot_targets --tasks {' '.join(args.tasks)}` on the committed pipeline's messages, "
              "scored on the distill stage's labelled audit slice: each teacher's expected label, and the teachers' "
              "weighted mixture under each weighting (W̄ normalised per text; the global model is the last teacher, "
              "learning without forgetting) — mean, spread of the per-true-label means, Spearman with the truth.\n")
    io.write_text(header + "\n" + io.markdown_table(table.round(3)) + "\n", OUT / "knot_targets.md")
    print(io.markdown_table(table.round(3)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
