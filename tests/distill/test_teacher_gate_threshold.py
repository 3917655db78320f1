"""``teacher_gate`` at its threshold: a teacher passes when its informativeness is ≥ the threshold (its docstring
and the distill stage's gate): exactly at the threshold it passes; with the threshold one float step above its
informativeness it fails."""
from __future__ import annotations

import math

import numpy as np

from otfed.distill.diagnostics import informativeness, teacher_gate
from otfed.label_space import LabelSpace

SA = LabelSpace.for_task("sa")


def test_a_teacher_exactly_at_the_threshold_passes_and_one_float_step_below_it_fails() -> None:
    rng = np.random.default_rng(11)
    labels = rng.integers(0, 5, size=40)
    probs = 0.5 * np.eye(5)[labels] + 0.5 * rng.dirichlet(np.ones(5), size=40)  # informative, not perfect
    info = informativeness(probs, labels, SA)
    assert 0.1 < info < 0.99
    at = teacher_gate({"t": probs}, labels, SA, threshold=info).iloc[0]
    assert at["informativeness"] == info and bool(at["passes"])
    above = teacher_gate({"t": probs}, labels, SA, threshold=math.nextafter(info, math.inf)).iloc[0]
    assert not bool(above["passes"])
    below = teacher_gate({"t": probs}, labels, SA, threshold=math.nextafter(info, -math.inf)).iloc[0]
    assert bool(below["passes"])
