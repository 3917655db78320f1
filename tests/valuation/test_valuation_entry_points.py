"""The data-valuation entry points' docstrings (issue #23): each has a Parameters and a Returns section (a valuation
class: Parameters for its constructor, its ``fit`` both) and a runnable example, and every example passes — each
checks its result against an independent truth: FedBary eq. 10 by hand, finite differences of POT's exact
``ot.emd2`` for the dual potential (FedBary eq. 9), the closed form against a single Dirac for the datum values,
the players' own worths in an additive game (exact, Monte-Carlo and truncated Monte-Carlo Shapley, leave-one-out),
the symmetric majority game, brute-force enumeration of all 4! orders for KNN-Shapley and of u(N) − u(N ∖ {i})
for KNN leave-one-out, and planted label noise for LAVA."""
from __future__ import annotations

from tests.docstring_examples import entry_point_tests

#: (module, qualified name) of every entry point with a runnable example
EXAMPLES = [
    ("otfed.valuation.calibrated", "calibrated_gradient"),
    ("otfed.valuation.calibrated", "dual_potential"),
    ("otfed.valuation.calibrated", "datum_values"),
    ("otfed.valuation.calibrated", "flag_noisy"),
    ("otfed.valuation.calibrated", "solve_dual_potential"),
    ("otfed.valuation.calibrated", "calibrated_threshold"),
    ("otfed.valuation.detection", "split_validation"),
    ("otfed.valuation.baselines", "ExactShapley"),
    ("otfed.valuation.baselines", "LeaveOneOut"),
    ("otfed.valuation.baselines", "PermutationShapley"),
    ("otfed.valuation.baselines", "TruncatedMonteCarloShapley"),
    ("otfed.valuation.baselines", "KNNShapley"),
    ("otfed.valuation.baselines", "knn_leave_one_out"),
    ("otfed.valuation.baselines", "Lava"),
]

#: the same entry points with their ``fit`` methods: a class documents its constructor's parameters (no Returns
#: section), its ``fit`` the data it takes and the values it returns
DOCUMENTED = [*EXAMPLES, ("otfed.valuation.baselines", "ValuationData"),
              *[("otfed.valuation.baselines", f"{cls}.fit") for cls in
                ("ExactShapley", "LeaveOneOut", "PermutationShapley", "TruncatedMonteCarloShapley", "KNNShapley",
                 "Lava")]]


test_the_entry_points_runnable_example_passes, test_the_entry_point_documents_its_parameters_and_result = \
    entry_point_tests(EXAMPLES, DOCUMENTED)
