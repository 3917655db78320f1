"""The optimal-transport entry points' docstrings (issue #23): each has a Parameters and a Returns section and a
runnable example, and every example passes — each checks its result against an independent truth: closed forms
(W_p between two Diracs, W₂ between a cloud and its translate = the distance of the means, the t-interpolant of
two Diracs = the Dirac at (1 − t)x + t·y, the geodesic W₂(μ, ξ_t) = t·W₂(μ, ν) of FedWaD eq. 4, OTDD of a
translated data set = √2·||v||, Gelbrich's bound attained by Gaussians), POT's exact and entropic solvers
(``ot.emd2``, ``ot.sinkhorn``, ``ot.gaussian.bures_wasserstein_distance``) and NumPy's class statistics."""
from __future__ import annotations

from tests.docstring_examples import entry_point_tests

#: (module, qualified name) of every documented entry point; a class documents its constructor's parameters (no
#: Returns section), its methods and the functions what they return
ENTRY_POINTS = [
    ("otfed.ot.measures", "Measure"),
    ("otfed.ot.measures", "Measure.uniform"),
    ("otfed.ot.exact", "exact_plan"),
    ("otfed.ot.exact", "wasserstein"),
    ("otfed.ot.exact", "optimal_transport"),
    ("otfed.ot.semidual", "semidual_plan"),
    ("otfed.ot.semidual", "entropic_potentials"),
    ("otfed.ot.interpolation", "interpolate_exact"),
    ("otfed.ot.interpolation", "interpolate_approx"),
    ("otfed.ot.interpolation", "interpolating_measure"),
    ("otfed.ot.otdd", "class_statistics"),
    ("otfed.ot.otdd", "augment_with_label_stats"),
    ("otfed.ot.otdd", "label_cost"),
    ("otfed.ot.otdd", "otdd_ground_cost"),
    ("otfed.ot.otdd", "otdd_exact"),
    ("otfed.ot.gelbrich", "gelbrich_bound"),
    ("otfed.ot.entropic_histograms", "entropic_histogram_transport"),
    ("otfed.ot.entropic_histograms", "sinkhorn_histogram_loss"),
]


test_the_entry_points_runnable_example_passes, test_the_entry_point_documents_its_parameters_and_result = \
    entry_point_tests(ENTRY_POINTS)
