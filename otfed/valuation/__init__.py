"""Data valuation: FedBary datum values (calibrated gradients, eq. 10), detection metrics, baselines.

- :mod:`.calibrated` — ``calibrated_gradient``, ``dual_potential`` (``solve_dual_potential`` with its convergence
  report), ``datum_values``, ``flag_noisy``, ``calibrated_threshold``, ``rank_by_value``; removal masks
  ``most_suspicious``, ``budget_removal``, ``flagged_removal``, ``random_removal``
- :mod:`.baselines` — ``ValuationData`` and ``fit(data) → values`` valuers: ``ExactShapley``,
  ``LeaveOneOut``, ``PermutationShapley``, ``TruncatedMonteCarloShapley``, ``KNNShapley``, ``Lava``;
  ``knn_leave_one_out``; utilities ``knn_utility``, ``classifier_accuracy``
- :mod:`.client_games` — the FedAvg-utility client game (``fedavg_utility``), ``MemoizedUtility``, the grand
  coalition's recorded rounds (``fedavg_rounds``), ``percent_of_total``
- :mod:`.reconstruction` — client values from FedAvg's recorded updates (FedBary §5.1's FL baselines):
  ``one_round_reconstruction`` (OR), ``multi_round_reconstruction`` (MR = FedShapley with λ_r = 1),
  ``gtg_shapley``; ``reconstructed_round_state``, ``reconstructed_final_state``, ``accuracy_utility``,
  ``ClientValues``, ``StateUtility``
- :mod:`.detection` — ``detection_scores`` (precision/recall/F1), ``detection_auc``, ``point_removal_curve``,
  ``split_validation`` (the calibration set of ``calibrated_threshold``)
- :mod:`.duplication` — duplicated data as measures (``repeated_dataset``, ``repeated_datum``,
  ``mass_moved_by_duplication``) and ``exact_wasserstein`` (POT), for FedBary table 3

Every name is imported from its module on first use (PEP 562): FedBary's datum values (:mod:`.calibrated`) need
neither scikit-learn nor torch, which the baselines and the FedAvg games pull in (the core install). Pipeline
code imports the modules themselves, so that its dependencies stay visible.
"""
import importlib

# name → the module that defines it
_SOURCES = {
    "ClientValues": "reconstruction",
    "DataValuation": "baselines",
    "DetectionScores": "detection",
    "ExactShapley": "baselines",
    "KNNShapley": "baselines",
    "Lava": "baselines",
    "LeaveOneOut": "baselines",
    "MemoizedUtility": "client_games",
    "PermutationShapley": "baselines",
    "RemovalCurve": "detection",
    "StateUtility": "reconstruction",
    "TruncatedMonteCarloShapley": "baselines",
    "Utility": "baselines",
    "ValuationData": "baselines",
    "accuracy_utility": "reconstruction",
    "budget_removal": "calibrated",
    "calibrated_gradient": "calibrated",
    "calibrated_threshold": "calibrated",
    "classifier_accuracy": "baselines",
    "datum_values": "calibrated",
    "detection_auc": "detection",
    "detection_scores": "detection",
    "dual_potential": "calibrated",
    "solve_dual_potential": "calibrated",
    "split_validation": "detection",
    "exact_wasserstein": "duplication",
    "fedavg_rounds": "client_games",
    "fedavg_utility": "client_games",
    "flag_noisy": "calibrated",
    "flagged_removal": "calibrated",
    "gtg_shapley": "reconstruction",
    "knn_leave_one_out": "baselines",
    "knn_utility": "baselines",
    "mass_moved_by_duplication": "duplication",
    "most_suspicious": "calibrated",
    "multi_round_reconstruction": "reconstruction",
    "one_round_reconstruction": "reconstruction",
    "percent_of_total": "client_games",
    "point_removal_curve": "detection",
    "random_removal": "calibrated",
    "rank_by_value": "calibrated",
    "reconstructed_final_state": "reconstruction",
    "reconstructed_round_state": "reconstruction",
    "repeated_dataset": "duplication",
    "repeated_datum": "duplication",
}

__all__ = [
    "ClientValues", "DataValuation", "budget_removal", "flagged_removal", "DetectionScores", "MemoizedUtility", "ExactShapley", "KNNShapley", "Lava",
    "LeaveOneOut", "PermutationShapley", "RemovalCurve", "StateUtility", "TruncatedMonteCarloShapley", "Utility",
    "ValuationData", "accuracy_utility", "calibrated_gradient", "classifier_accuracy", "datum_values",
    "detection_auc", "detection_scores", "dual_potential", "exact_wasserstein", "fedavg_rounds", "fedavg_utility", "flag_noisy", "gtg_shapley", "knn_leave_one_out",
    "knn_utility", "mass_moved_by_duplication", "multi_round_reconstruction", "one_round_reconstruction",
    "most_suspicious", "percent_of_total", "point_removal_curve", "random_removal", "rank_by_value", "reconstructed_final_state",
    "reconstructed_round_state", "repeated_dataset", "repeated_datum",
    "calibrated_threshold", "solve_dual_potential", "split_validation",
]


def __getattr__(name: str):
    """A public name of this package, imported from its module when first asked for."""
    if name in _SOURCES:
        return getattr(importlib.import_module(f"otfed.valuation.{_SOURCES[name]}"), name)
    raise AttributeError(f"module 'otfed.valuation' has no attribute {name!r}")
