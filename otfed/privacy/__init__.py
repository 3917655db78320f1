"""What the papers' protocols reveal to an honest-but-curious server, and a defence with a guarantee.

:mod:`otfed.privacy.attack` reconstructs client samples (and, for federated OTDD / FedBary, labels and class
statistics) from the messages a server legitimately receives and sends; :mod:`otfed.privacy.dp` is a
differentially private FedWaD client (clipping and Gaussian noise, accounted with ``dp-accounting``).
"""
from otfed.privacy.attack import (AttackConfig, AttackResult, BaryRound, InterpolationRound, LabelledReconstruction,
                                  Reconstruction, ReconstructionScores, ServerView, TimeEstimate, attack_experiment,
                                  attack_fedbary, attack_fedwad, attack_otdd, decode_label_augmented,
                                  estimate_fedbary_times, estimate_time_from_coincidences,
                                  estimate_time_from_distance, estimate_times, estimate_times_from_means,
                                  estimate_times_from_monitor, fedbary_rounds, feature_dim, fedwad_rounds,
                                  interpolant_sources, invert_fedbary_round, invert_interpolation, label_scores,
                                  nn_scale, reconstruct_rounds, reconstruction_scores, server_view)

from otfed.privacy.dp import (DPConfig, DPFedWaDResult, DPWassersteinClient, PrivacyBudgetError,
                              dp_federated_wasserstein, gaussian_epsilon, gaussian_noise_multiplier)

__all__ = [
    "DPConfig", "DPFedWaDResult", "DPWassersteinClient", "PrivacyBudgetError", "dp_federated_wasserstein",
    "gaussian_epsilon", "gaussian_noise_multiplier",
    "AttackConfig", "AttackResult", "BaryRound", "InterpolationRound", "LabelledReconstruction", "Reconstruction",
    "ReconstructionScores", "ServerView", "TimeEstimate", "attack_experiment", "attack_fedbary", "attack_fedwad",
    "attack_otdd", "decode_label_augmented", "estimate_fedbary_times", "estimate_time_from_coincidences",
    "estimate_time_from_distance", "estimate_times", "estimate_times_from_means", "estimate_times_from_monitor",
    "fedbary_rounds", "feature_dim", "fedwad_rounds", "interpolant_sources", "invert_fedbary_round",
    "invert_interpolation", "label_scores", "nn_scale", "reconstruct_rounds", "reconstruction_scores",
    "server_view",
]
