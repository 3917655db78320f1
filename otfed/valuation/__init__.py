"""Data valuation: FedBary datum values (calibrated gradients, eq. 10), detection metrics, baselines.

- :mod:`.calibrated` — ``calibrated_gradient``, ``dual_potential``, ``datum_values``, ``flag_noisy``,
  ``rank_by_value``; removal masks ``most_suspicious``, ``budget_removal``, ``flagged_removal``, ``random_removal``
- :mod:`.baselines` — ``ValuationData`` and ``fit(data) → values`` valuers: ``ExactShapley``,
  ``LeaveOneOut``, ``PermutationShapley``, ``TruncatedMonteCarloShapley``, ``KNNShapley``, ``Lava``;
  ``knn_leave_one_out``; utilities ``knn_utility``, ``classifier_accuracy``
- :mod:`.client_games` — the FedAvg-utility client game (``fedavg_utility``), ``MemoizedUtility``, the grand
  coalition's recorded rounds (``fedavg_rounds``), ``percent_of_total``
- :mod:`.reconstruction` — client values from FedAvg's recorded updates (FedBary §5.1's FL baselines):
  ``one_round_reconstruction`` (OR), ``multi_round_reconstruction`` (MR = FedShapley with λ_r = 1),
  ``gtg_shapley``; ``reconstructed_round_state``, ``reconstructed_final_state``, ``accuracy_utility``,
  ``ClientValues``, ``StateUtility``
- :mod:`.detection` — ``detection_scores`` (precision/recall/F1), ``detection_auc``, ``point_removal_curve``
- :mod:`.duplication` — duplicated data as measures (``repeated_dataset``, ``repeated_datum``,
  ``mass_moved_by_duplication``) and ``exact_wasserstein`` (POT), for FedBary table 3
"""
from otfed.valuation.baselines import (DataValuation, ExactShapley, KNNShapley, Lava, LeaveOneOut,
                                       PermutationShapley, TruncatedMonteCarloShapley, Utility, ValuationData,
                                       classifier_accuracy, knn_leave_one_out, knn_utility)
from otfed.valuation.calibrated import (budget_removal, calibrated_gradient, datum_values, dual_potential, flag_noisy,
                                        flagged_removal, most_suspicious, random_removal, rank_by_value)
from otfed.valuation.client_games import MemoizedUtility, fedavg_rounds, fedavg_utility, percent_of_total
from otfed.valuation.detection import (DetectionScores, RemovalCurve, detection_auc, detection_scores,
                                      point_removal_curve)
from otfed.valuation.duplication import (exact_wasserstein, mass_moved_by_duplication, repeated_dataset,
                                         repeated_datum)
from otfed.valuation.reconstruction import (ClientValues, StateUtility, accuracy_utility, gtg_shapley,
                                            multi_round_reconstruction, one_round_reconstruction,
                                            reconstructed_final_state, reconstructed_round_state)

__all__ = [
    "ClientValues", "DataValuation", "budget_removal", "flagged_removal", "DetectionScores", "MemoizedUtility", "ExactShapley", "KNNShapley", "Lava",
    "LeaveOneOut", "PermutationShapley", "RemovalCurve", "StateUtility", "TruncatedMonteCarloShapley", "Utility",
    "ValuationData", "accuracy_utility", "calibrated_gradient", "classifier_accuracy", "datum_values",
    "detection_auc", "detection_scores", "dual_potential", "exact_wasserstein", "fedavg_rounds", "fedavg_utility", "flag_noisy", "gtg_shapley", "knn_leave_one_out",
    "knn_utility", "mass_moved_by_duplication", "multi_round_reconstruction", "one_round_reconstruction",
    "most_suspicious", "percent_of_total", "point_removal_curve", "random_removal", "rank_by_value", "reconstructed_final_state",
    "reconstructed_round_state", "repeated_dataset", "repeated_datum",
]
