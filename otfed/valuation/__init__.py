"""Data valuation: FedBary datum values (calibrated gradients, eq. 10), detection metrics, baselines.

- :mod:`.calibrated` — ``calibrated_gradient``, ``dual_potential``, ``datum_values``, ``flag_noisy``,
  ``rank_by_value``
- :mod:`.baselines` — ``ValuationData`` and ``fit(data) → values`` valuers: ``ExactShapley``,
  ``LeaveOneOut``, ``PermutationShapley``, ``KNNShapley``, ``Lava``; utilities ``knn_utility``,
  ``classifier_accuracy``
- :mod:`.detection` — ``detection_scores`` (precision/recall/F1), ``point_removal_curve``
"""
from otfed.valuation.baselines import (DataValuation, ExactShapley, KNNShapley, Lava, LeaveOneOut,
                                       PermutationShapley, Utility, ValuationData, classifier_accuracy,
                                       knn_utility)
from otfed.valuation.calibrated import calibrated_gradient, datum_values, dual_potential, flag_noisy, rank_by_value
from otfed.valuation.detection import DetectionScores, RemovalCurve, detection_scores, point_removal_curve

__all__ = [
    "DataValuation", "DetectionScores", "ExactShapley", "KNNShapley", "Lava", "LeaveOneOut", "PermutationShapley",
    "RemovalCurve", "Utility", "ValuationData", "calibrated_gradient", "classifier_accuracy", "datum_values",
    "detection_scores", "dual_potential", "flag_noisy", "knn_utility", "point_removal_curve", "rank_by_value",
]
