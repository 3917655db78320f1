"""The KNOT entry points' docstrings (issue #23): each has a Parameters and a Returns section and a runnable example,
and every example passes — each checks its result against an independent truth: POT's exact solver for eq. 3's
Sinkhorn term at small ε, SciPy's KL for the "Entropy" baseline, hand-computed A/D/U/E weights (Definition 5.1),
the bias counted by hand, the closed-form minimisers of eq. 3 for the student, the paper's own Semantic Distance
example, brute force for the best constant."""
from __future__ import annotations

from tests.docstring_examples import entry_point_tests

#: (module, function) of every documented entry point
ENTRY_POINTS = [
    ("otfed.distill.losses", "ensemble_loss"),
    ("otfed.distill.losses", "kl_histogram_loss"),
    ("otfed.distill.losses", "mixture_sinkhorn_loss"),
    ("otfed.distill.losses", "teacher_stack"),
    ("otfed.distill.weights", "teacher_weights"),
    ("otfed.distill.bias", "random_texts"),
    ("otfed.distill.bias", "probability_bias"),
    ("otfed.distill.bias", "probability_biases"),
    ("otfed.distill.student", "ensemble_weights"),
    ("otfed.distill.student", "distill_student"),
    ("otfed.distill.diagnostics", "best_constant"),
    ("otfed.distill.diagnostics", "teacher_gate"),
    ("otfed.metrics", "semantic_distance"),
    ("otfed.federation.knot", "teacher_ensemble"),
]


test_the_entry_points_runnable_example_passes, test_the_entry_point_documents_its_parameters_and_result = \
    entry_point_tests(ENTRY_POINTS)
