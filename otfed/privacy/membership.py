"""Membership inference against KNOT's teachers from their prediction messages.

KNOT (§4, §6) has every local teacher send the server its class probabilities on the transfer texts. A
curious server that chooses the transfer set (the server holds it; nothing in the protocol lets a client
check it) can put candidate records there — texts it suspects a client trained on — and read the teacher's
probability vector on each from the ordinary prediction messages. Whether a candidate was a training record
is then the standard membership inference game (Shokri et al. 2017), played here with the two attacks that
need no shadow model:

* **loss threshold** (Yeom et al. 2018, "Privacy risk in machine learning", attack 1): with the candidate's
  label known, score = log p(y | x) — training records have a smaller loss;
* **confidence** (Salem et al. 2019, "ML-Leaks", adversary 3): without labels, score = max_c p(c | x).

Both are scored by the ROC AUC of member vs non-member scores (0.5: the messages reveal nothing about
membership; 1: every member is told apart), computed over every (member, non-member) pair (ties count ½),
and by the advantage max_τ (TPR − FPR) (Yeom et al.'s membership advantage, at the best threshold τ).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["MembershipScores", "confidence_scores", "loss_scores", "membership_auc", "membership_advantage",
           "membership_inference"]


def loss_scores(probabilities: np.ndarray, labels: np.ndarray, floor: float = 1e-12) -> np.ndarray:
    """log p(y_i | x_i) per record (larger = more likely a member; Yeom et al. 2018's loss attack)."""
    p = np.asarray(probabilities, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if p.ndim != 2 or y.shape != (p.shape[0],):
        raise ValueError(f"probabilities must be n × classes and labels n long (got {p.shape} and {y.shape})")
    if y.size and (y.min() < 0 or y.max() >= p.shape[1]):
        raise ValueError(f"labels must lie in 0..{p.shape[1] - 1}")
    return np.log(np.maximum(p[np.arange(len(y)), y], floor))


def confidence_scores(probabilities: np.ndarray) -> np.ndarray:
    """max_c p(c | x_i) per record (label-free; Salem et al. 2019)."""
    return np.asarray(probabilities, dtype=np.float64).max(axis=1)


def membership_auc(members: np.ndarray, non_members: np.ndarray) -> float:
    """P(score of a random member > score of a random non-member) + ½ P(tie): the ROC AUC of the scores
    (Mann–Whitney U / (m·n)), by ranks."""
    a = np.asarray(members, dtype=np.float64).ravel()
    b = np.asarray(non_members, dtype=np.float64).ravel()
    if a.size == 0 or b.size == 0:
        raise ValueError("membership_auc needs at least one member and one non-member")
    both = np.concatenate([a, b])
    order = np.argsort(both, kind="mergesort")
    ranks = np.empty(both.size, dtype=np.float64)
    sorted_values = both[order]
    start = 0
    while start < both.size:  # average ranks over ties
        stop = start + 1
        while stop < both.size and sorted_values[stop] == sorted_values[start]:
            stop += 1
        ranks[order[start:stop]] = (start + stop + 1) / 2.0
        start = stop
    u = ranks[:a.size].sum() - a.size * (a.size + 1) / 2.0
    return float(u / (a.size * b.size))


def membership_advantage(members: np.ndarray, non_members: np.ndarray) -> float:
    """max over thresholds τ of TPR(τ) − FPR(τ), "member" when score ≥ τ (Yeom et al. 2018, definition 4 at
    the attacker's best threshold; 0 for τ above every score)."""
    a = np.sort(np.asarray(members, dtype=np.float64).ravel())
    b = np.sort(np.asarray(non_members, dtype=np.float64).ravel())
    thresholds = np.unique(np.concatenate([a, b]))
    tpr = 1.0 - np.searchsorted(a, thresholds, side="left") / a.size
    fpr = 1.0 - np.searchsorted(b, thresholds, side="left") / b.size
    return float(max(0.0, np.max(tpr - fpr)))


@dataclass(frozen=True)
class MembershipScores:
    """One teacher under attack: the ROC AUC and advantage of the loss and the confidence attacks, the number
    of members and non-members scored."""

    loss_auc: float
    loss_advantage: float
    confidence_auc: float
    confidence_advantage: float
    members: int
    non_members: int


def membership_inference(member_probabilities: np.ndarray, member_labels: np.ndarray,
                         non_member_probabilities: np.ndarray, non_member_labels: np.ndarray) -> MembershipScores:
    """Both attacks on a teacher's probability vectors for candidate records whose membership the evaluation
    knows (members: its training records; non-members: records of the same distribution it never saw).

    Parameters:
        member_probabilities: the teacher's n × C probability vectors on its training records (as the server
            reads them from KNOT's prediction messages).
        member_labels: their n labels, in 0..C − 1 (the loss attack's).
        non_member_probabilities, non_member_labels: the same for m records the teacher never saw.

    Returns:
        A :class:`MembershipScores`: ROC AUC and advantage of the loss attack (log p(y | x)) and of the
        confidence attack (max_c p(c | x)), and the numbers of members and non-members.

    Raises ValueError for shapes that do not match, labels out of range, or no member or no non-member.

    Against brute force: the AUC as the share of (member, non-member) pairs the score orders correctly (ties ½),
    the advantage as the best TPR − FPR over every threshold:

    >>> members = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]])
    >>> outsiders = np.array([[0.6, 0.4], [0.5, 0.5], [0.3, 0.7], [0.9, 0.1]])
    >>> scores = membership_inference(members, np.array([0, 1, 0]), outsiders, np.array([1, 0, 1, 0]))
    >>> def brute_force(a, b):
    ...     auc = np.mean([(s > t) + 0.5 * (s == t) for s in a for t in b])
    ...     return float(auc), max(float(np.mean(a >= t) - np.mean(b >= t)) for t in np.concatenate([a, b]))
    >>> brute_force(np.log([0.9, 0.8, 0.7]), np.log([0.4, 0.5, 0.7, 0.9])), (scores.loss_auc, scores.loss_advantage)
    ((0.75, 0.5), (0.75, 0.5))
    >>> brute_force(members.max(axis=1), outsiders.max(axis=1)) == (scores.confidence_auc, scores.confidence_advantage)
    True
    """
    loss_in = loss_scores(member_probabilities, member_labels)
    loss_out = loss_scores(non_member_probabilities, non_member_labels)
    conf_in = confidence_scores(member_probabilities)
    conf_out = confidence_scores(non_member_probabilities)
    return MembershipScores(membership_auc(loss_in, loss_out), membership_advantage(loss_in, loss_out),
                            membership_auc(conf_in, conf_out), membership_advantage(conf_in, conf_out),
                            len(loss_in), len(loss_out))
