"""The distill stage's gate on the audit slice (``stages.distill.audit_gate``), on hand-made teachers whose verdict
is known: a teacher that puts its mass on the true label reads its texts (Spearman 1 with the truth), one that
predicts the same histogram for every text does not (no correlation), and a global model that predicts a constant
cannot beat the best constant's Semantic Distance."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from otfed.distill.ensemble import TeacherEnsemble
from stages.distill import CANNOT_TEST, audit_gate, transfer_split

LABELS = np.array([0, 1, 2, 3, 4] * 8)  # SA's five labels on 40 audit rows


def sharp(labels: np.ndarray) -> np.ndarray:
    return np.eye(5)[labels] * 0.8 + 0.04


def flat(n: int) -> np.ndarray:
    return np.tile([0.1, 0.1, 0.2, 0.2, 0.4], (n, 1))


def gate(local_a: np.ndarray, local_b: np.ndarray, glob: np.ndarray):
    n_transfer = 60
    audit = np.arange(10, 50)
    full = [np.full((n_transfer, 5), 0.2) for _ in range(3)]
    for f, p in zip(full, (local_a, local_b, glob)):
        f[audit] = p
    ens = TeacherEnsemble(("a", "b", "g"), np.stack(full, axis=1), np.array([10, 10, 10]), None)
    fed = SimpleNamespace(audit_index=audit, audit_labels=LABELS, global_party=SimpleNamespace(name="g"))
    return audit_gate("sa", fed, ens, 0.3)


def test_one_informative_local_and_an_informative_global_make_the_task_testable() -> None:
    table, verdict, reason = gate(sharp(LABELS), flat(40), sharp(LABELS))
    assert verdict == "testable" and reason == ""
    assert table.passes.tolist() == [True, False, True] and table.role.tolist() == ["local", "local", "global"]
    assert table.informativeness.iloc[0] == 1.0 and np.isnan(table.informativeness.iloc[1])
    assert (table.n == 40).all()


def test_a_constant_global_model_or_no_informative_local_cannot_test() -> None:
    _, verdict, reason = gate(sharp(LABELS), flat(40), flat(40))
    assert verdict == CANNOT_TEST and "global model does not beat the best constant" in reason
    _, verdict, reason = gate(flat(40), flat(40), sharp(LABELS))
    assert verdict == CANNOT_TEST and "no local teacher" in reason


def test_the_transfer_split_leaves_the_audit_slice_out() -> None:
    audit = np.array([3, 7, 11])
    train, held = transfer_split(100, audit, 0.2, seed=0)
    assert len(held) == round(0.2 * 97) and len(train) + len(held) == 97
    assert not set(train) & set(held) and not (set(train) | set(held)) & set(audit)
    again = transfer_split(100, audit, 0.2, seed=0)
    assert np.array_equal(again[0], train) and np.array_equal(again[1], held)
