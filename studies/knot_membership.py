"""Membership inference against KNOT's teachers (issue #24 item 5): what a curious server that chooses the
transfer set learns about who trained on what, from the ordinary prediction messages.

Threat model (otfed.privacy.membership): the server plants candidate texts in the transfer set and reads each
teacher's probability vector on them. Here the candidates are, per teacher of the committed pipeline
(``models/text/<task>/<party>``, trained by stage train_teachers on ``data/text_partitions``), up to
``--per-side`` of its training texts (members) and as many of its validation + test texts (non-members: the
same party's distribution, never trained on), the first ones in partition order. The teacher's probabilities
are exactly what its prediction message would carry for those texts (``TextClassifier.predict_proba``, the
call train_teachers uses for the transfer set). Reported per teacher: the loss and confidence attacks' ROC AUC
and advantage, and the teacher's accuracy on the members and on the non-members (its generalisation gap —
what the attacks feed on).

    python -m studies.knot_membership [--per-side 300]
Results: reports/studies/knot_membership.{csv,md}.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from otfed import io
from otfed.data.text.store import load_text_federation
from otfed.models import TextClassifier
from otfed.privacy.membership import membership_inference

PARTITIONS = Path("data/text_partitions")
MODELS = Path("models/text")
OUT = Path("reports/studies")


def teacher_rows(per_side: int) -> list[dict]:
    rows = []
    for task_dir in sorted(p for p in PARTITIONS.iterdir() if p.is_dir()):
        fed = load_text_federation(task_dir)
        for party in fed.parties:
            model_dir = MODELS / task_dir.name / party.name
            if not model_dir.exists():
                continue
            clf = TextClassifier.load(model_dir)
            k = min(per_side, len(party.train.texts), len(party.val.texts) + len(party.test.texts))
            members = list(party.train.texts[:k]), np.asarray(party.train.labels[:k])
            outside_texts = list(party.val.texts) + list(party.test.texts)
            outside_labels = np.concatenate([np.asarray(party.val.labels), np.asarray(party.test.labels)])
            non_members = outside_texts[:k], outside_labels[:k]
            p_in = clf.predict_proba(members[0])
            p_out = clf.predict_proba(non_members[0])
            s = membership_inference(p_in, members[1], p_out, non_members[1])
            rows.append(dict(task=task_dir.name, party=party.name, role=party.role, n_train=len(party.train.texts),
                             members=s.members, non_members=s.non_members,
                             member_accuracy=float(np.mean(p_in.argmax(axis=1) == members[1])),
                             non_member_accuracy=float(np.mean(p_out.argmax(axis=1) == non_members[1])),
                             loss_auc=s.loss_auc, loss_advantage=s.loss_advantage,
                             confidence_auc=s.confidence_auc, confidence_advantage=s.confidence_advantage))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-side", type=int, default=300, help="members (and non-members) scored per teacher")
    args = parser.parse_args(argv)
    table = pd.DataFrame(teacher_rows(args.per_side))
    OUT.mkdir(parents=True, exist_ok=True)
    io.write_csv(table.round(4), OUT / "knot_membership.csv")
    by_task = table.groupby("task").agg(teachers=("party", "size"), loss_auc=("loss_auc", "mean"),
                                        loss_auc_max=("loss_auc", "max"), confidence_auc=("confidence_auc", "mean"),
                                        gap=("member_accuracy", "mean"))
    by_task["gap"] = by_task["gap"] - table.groupby("task").non_member_accuracy.mean()
    header = (f"# KNOT teachers: membership inference from prediction messages\n\n"
              f"`python -m studies.knot_membership --per-side {args.per_side}` on the committed teachers "
              "(models/text). Per teacher: loss attack (log p(y|x), labels known) and confidence attack (max "
              "probability) — ROC AUC (0.5: nothing learnt) and advantage max(TPR − FPR); accuracy on the members "
              "(training texts) and non-members (its validation + test texts). Per task: means over its teachers; "
              "gap = member − non-member accuracy.\n")
    io.write_text(header + "\n" + io.markdown_table(by_task.reset_index().round(3)) + "\n\n"
                  + io.markdown_table(table.round(3)) + "\n", OUT / "knot_membership.md")
    print(io.markdown_table(by_task.reset_index().round(3)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
