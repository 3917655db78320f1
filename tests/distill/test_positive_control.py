"""Positive control for KNOT's claim that the Sinkhorn loss (eq. 3) gives a lower Semantic Distance than the KL
("Entropy") baseline: a small synthetic ORDINAL task on which the mechanism must show, trained end to end by
the library's own :func:`otfed.distill.student.distill_student`.

The task (fixed before any run, then left alone):

- SA's five ordered labels (coordinates 1..5, cost |i − j|); an input is a number x ∈ [0, 1) and its label
  is the bin y = ⌊5x⌋. The transfer set is 256 draws x ~ U[0, 1) (seeded); Semantic Distance is measured on
  1,000 evenly spaced test inputs.
- Three teachers, label-skewed clients: teacher k never saw label L_k ∈ {1, 2, 3} (weak negative, neutral,
  weak positive), so on inputs of that label it predicts the nearest label it knows — L_k − 1 on the lower
  half of the bin, L_k + 1 on the upper half. Its mistakes therefore go to ADJACENT labels only, and at any
  input at most one teacher is wrong. A teacher's prediction for its label b is soft and ordinal,
  q_l ∝ exp(−2 |l − b|) (0.70 on b for an interior label).
- Weights "A" (W̄_k = 1/3). Eq. 3 with ε → 0 is Σ_k W̄_k W1(q_k, p), minimised by p whose CDF is the median of
  the teachers' CDFs: the two agreeing teachers' answer. KL's Σ_k W̄_k KL(q_k || p) is minimised by the mixture,
  whose expected label is pulled by 1/3 towards the wrong teacher's. A student equal to these pointwise optima
  would score SD 0.076 (median) against 0.250 (mixture) on this test set — in closed form: with r = e⁻² and
  E_b = Σ_l l·r^|l−b| / Σ_l r^|l−b| (the expected label of a teacher answering b, labels 0..4), each label has
  100 test inputs in each half of its bin, the median is the two agreeing teachers' q (error |E_y − y|: E_0 on
  labels 0 and 4, E_1 − 1 on labels 1 and 3, 0 on label 2) and the mixture's error is |2(E_y − y) + E_w − y| / 3
  for the wrong teacher's w = y ± 1, so SD_median = (2E_0 + 2(E_1 − 1)) / 5 = 0.07617 and SD_mixture =
  (2E_0 + |2E_1 + E_0 − 3| / 3 + (2E_1 − 1) / 3 + (2 − E_1) / 3) / 5 = 0.24982.

The student is a softmax-linear model on a fixed encoding of x (20 Gaussian bumps of width 1/40), the analogue
of a bag-of-words student; both losses train the same student with the same seeds: ε = 0.01 (the distill
stage's), AdamW lr 0.1 without weight decay, batch 64, 100 epochs — by then every loss has stopped improving
(asserted). A first try with a 1→32→5 tanh MLP on raw x had not converged after 100–150 epochs (Sinkhorn loss
still falling at 0.24–0.30 against a pointwise floor of 0.19; SDs then 0.20–0.235 Sinkhorn, 0.238–0.244 KL) and
cost too much time, so the student was changed to this better-conditioned one for convergence, the teachers and
the metric untouched. On seed 0, 1,600 full-batch steps with a decaying step size end within 0.002 of the SDs
below.

Measured SD, Sinkhorn (eq. 3) vs KL, per seed: 0: 0.1169 vs 0.2516; 1: 0.1160 vs 0.2521; 2: 0.1104 vs 0.2484
(asserted here); seeds 3–5, run once outside the suite: 0.1155 vs 0.2482, 0.1036 vs 0.2557, 0.1094 vs 0.2484.
Paired differences 0.133–0.152. The mixture ablation (one Sinkhorn term to the teachers' mixture) lands with KL, as
the closed form predicts: 0.2477 on seed 0 (0.2450–0.2555 on seeds 1–5). The seven trainings take about 30 s of one
core (marked ``slow``: ``make test`` runs them, ``make test-fast`` leaves them out). The asserted margin, 0.1, was
set before these runs, as half the KL student's expected excess on the three middle labels' share (3/5 · 1/3 =
0.2), and holds on all six seeds.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from otfed.device import torch_threads
from otfed.distill.ensemble import TeacherEnsemble
from otfed.distill.student import distill_student, ensemble_weights
from otfed.label_space import LabelSpace
from otfed.metrics import semantic_distance

SA = LabelSpace.for_task("sa")
C = SA.n_labels
MISSING = (1, 2, 3)  # the label each teacher never saw
SHARPNESS = 2.0  # a teacher's prediction for label b: q_l ∝ exp(−SHARPNESS·|l − b|)
N_TRANSFER, BATCH, EPOCHS, LR, EPS = 256, 64, 100, 0.1, 0.01
N_FEATURES, WIDTH = 20, 0.5 / 20
SEEDS = (0, 1, 2)
RUNS = [(seed, kind) for seed in SEEDS for kind in ("sinkhorn", "kl")] + [(0, "sinkhorn_mixture")]
MARGIN = 0.1  # SD(KL) − SD(Sinkhorn), paired by seed
TEST_X = (np.arange(1000) + 0.5) / 1000


def labels_of(x: np.ndarray) -> np.ndarray:
    return np.minimum((np.asarray(x) * C).astype(int), C - 1)


def teacher_labels(x: np.ndarray) -> np.ndarray:
    """N×K: the label each teacher predicts — the true one, except on its missing label (the nearer known one)."""
    y = labels_of(x)
    lower_half = np.asarray(x) * C - y < 0.5
    return np.stack([np.where(y == L, np.where(lower_half, L - 1, L + 1), y) for L in MISSING], axis=1)


def teacher_probs(x: np.ndarray) -> np.ndarray:
    """N×K×C soft ordinal predictions centred on :func:`teacher_labels`."""
    distance = np.abs(np.arange(C) - teacher_labels(x)[..., None])
    e = np.exp(-SHARPNESS * distance)
    return e / e.sum(-1, keepdims=True)


class RbfStudent:
    """Softmax-linear student on Gaussian bumps of x; a "text" is the decimal string of x."""

    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.centres = (torch.arange(N_FEATURES, dtype=torch.float64) + 0.5) / N_FEATURES
        self.model = torch.nn.Linear(N_FEATURES, C)
        with torch.no_grad():
            self.model.weight.copy_(0.1 * torch.randn(C, N_FEATURES, generator=g))
            self.model.bias.zero_()

    def pretokenize(self, texts):
        return [float(t) for t in texts]

    def collate(self, features):
        x = torch.tensor(features, dtype=torch.float64)[:, None]
        return torch.exp(-0.5 * ((x - self.centres) / WIDTH) ** 2).float()

    def logits(self, batch):
        return self.model(batch)

    def probs(self, x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return torch.softmax(self.model(self.collate(list(map(float, x)))), -1).double().numpy()


def distilled(seed: int, kind: str) -> dict:
    """Train one student with ``kind``; its per-epoch losses and test SDs."""
    x = np.random.default_rng(seed).random(N_TRANSFER)
    ensemble = TeacherEnsemble(("t1", "t2", "t3"), teacher_probs(x), np.ones(len(MISSING), dtype=int), None)
    student = RbfStudent(seed)
    sds: list[float] = []
    with torch_threads(1):
        history = distill_student(
            student, [repr(float(v)) for v in x], ensemble, ensemble_weights(ensemble, "A"), kind=kind,
            cost=SA.cost_matrix(torch.float32), eps=EPS, epochs=EPOCHS, batch_size=BATCH, lr=LR, weight_decay=0.0,
            seed=seed, progress=False,
            on_epoch=lambda record: sds.append(semantic_distance(student.probs(TEST_X), labels_of(TEST_X), SA)))
    return {"loss": np.array([h["loss"] for h in history]), "sd": np.array(sds)}


@pytest.fixture(scope="module")
def runs() -> dict:
    return {run: distilled(*run) for run in RUNS}


def test_the_task_is_ordinal_with_a_correct_majority_and_adjacent_mistakes() -> None:
    x = np.linspace(0, 1, 2001)[:-1]
    y, b = labels_of(x), teacher_labels(x)
    assert set(np.unique(y)) == set(range(C))
    assert np.abs(b - y[:, None]).max() == 1  # mistakes go to an adjacent label only
    assert ((b != y[:, None]).sum(1) <= 1).all()  # never more than one teacher wrong
    for k, L in enumerate(MISSING):  # each teacher wrong exactly on its missing label
        np.testing.assert_array_equal(b[:, k] != y, y == L)


def closed_form_sds() -> tuple[float, float]:
    """SD of the median-CDF student and of the mixture student on TEST_X, derived by hand (module docstring):
    the teachers' expected labels E_0 and E_1 as polynomials in r = e⁻², the per-label errors weighted by the
    test inputs in each half of a bin (100 and 100)."""
    r = np.exp(-SHARPNESS)
    e0 = (r + 2 * r ** 2 + 3 * r ** 3 + 4 * r ** 4) / (1 + r + r ** 2 + r ** 3 + r ** 4)  # teacher answering 0
    e1 = (1 + 2 * r + 3 * r ** 2 + 4 * r ** 3) / (1 + 2 * r + r ** 2 + r ** 3)  # teacher answering 1
    median = (2 * e0 + 2 * (e1 - 1)) / 5  # labels 0 and 4, 1 and 3 (symmetric), 2 (error 0)
    # label 1: the wrong teacher says 0 (lower half), then 2 (upper half; E_2 = 2 by symmetry)
    label_1 = (abs(2 * (e1 - 1) + (e0 - 1)) + abs(2 * (e1 - 1) + (2 - 1))) / 3 / 2
    label_2 = abs(e1 - 2) / 3  # wrong teacher says 1 (lower half) or 3 (upper half): the same error
    return median, (2 * e0 + 2 * label_1 + label_2) / 5


def test_the_pointwise_optima_score_the_closed_form_sds() -> None:
    """The median-CDF and mixture students scored by the library's Semantic Distance match the hand derivation,
    whose values are the docstring's 0.076 and 0.250."""
    y = labels_of(TEST_X)
    upper_half = TEST_X * C - y >= 0.5
    assert all(((y == label) & upper_half).sum() == ((y == label) & ~upper_half).sum() == 100 for label in range(C))
    q = teacher_probs(TEST_X)
    median = np.diff(np.median(np.cumsum(q, -1), axis=1), prepend=0.0, axis=-1)
    want_median, want_mixture = closed_form_sds()
    assert semantic_distance(median, y, SA) == pytest.approx(want_median, rel=1e-12)
    assert semantic_distance(q.mean(1), y, SA) == pytest.approx(want_mixture, rel=1e-12)
    assert (round(want_median, 5), round(want_mixture, 5)) == (0.07617, 0.24982)


@pytest.mark.slow
@pytest.mark.parametrize("seed, kind", RUNS)
def test_training_ran_to_convergence(runs, seed, kind) -> None:
    """The loss stopped improving: over the last fifth of the epochs its mean fell by less than 0.5 % of its fall
    since the first epoch (measured on seeds 0–5: ≤ 0.13 %), and the test SD wobbled by less than a fifth of the
    asserted margin (measured: ≤ 0.0122)."""
    loss, sd = runs[(seed, kind)]["loss"], runs[(seed, kind)]["sd"]
    tail = EPOCHS // 5
    fall = loss[0] - loss[-tail:].mean()
    assert fall > 0.5 * loss[0]  # it did train
    assert loss[-2 * tail:-tail].mean() - loss[-tail:].mean() < 0.005 * fall
    assert np.ptp(sd[-tail:]) < MARGIN / 5


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_sinkhorn_student_has_a_lower_semantic_distance_than_the_kl_student(runs, seed) -> None:
    sinkhorn, kl = runs[(seed, "sinkhorn")]["sd"][-1], runs[(seed, "kl")]["sd"][-1]
    assert kl - sinkhorn >= MARGIN, f"seed {seed}: SD Sinkhorn {sinkhorn:.4f}, KL {kl:.4f}"


@pytest.mark.slow
def test_the_mixture_ablation_lands_with_kl_not_with_eq3(runs) -> None:
    """One Sinkhorn term to the teachers' mixture (the ablation) has the mixture as its minimiser, like KL: the
    gain comes from eq. 3's sum of per-teacher terms (a median), not from the OT geometry alone."""
    mixture, kl, sinkhorn = (runs[(0, kind)]["sd"][-1] for kind in ("sinkhorn_mixture", "kl", "sinkhorn"))
    assert abs(mixture - kl) < 0.02
    assert mixture - sinkhorn >= MARGIN
