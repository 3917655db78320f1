"""What the papers' protocols reveal to an honest-but-curious server, and a defence with a guarantee.

:mod:`otfed.privacy.attack` reconstructs client samples (and, for federated OTDD / FedBary, labels and class
statistics) from the messages a server legitimately receives and sends; :mod:`otfed.privacy.dp` is a
differentially private FedWaD client (clipping and Gaussian noise, accounted with ``dp-accounting``);
:mod:`otfed.privacy.dp_fedbary` the same for FedBary; :mod:`otfed.privacy.accountant` a client's budget persisted
across sessions. The stronger attacks on DP messages (round averaging, a likelihood ratio over rounds,
clip-radius canaries, membership over many splits) are in :mod:`otfed.privacy.attack`.
"""
from otfed.privacy.accountant import BudgetLedger, Reservation, composed_epsilon
from otfed.privacy.attack import (AttackConfig, AttackResult, BaryRound, CanaryAudit, DPAttackScores,
                                  InterpolationRound, LabelledReconstruction, MembershipSplits, Reconstruction,
                                  ReconstructionScores, ServerView, TimeEstimate, attack_experiment, canary_audit,
                                  clip_canaries, dp_attack, membership_auc_interval, membership_splits, round_average,
                                  round_likelihood_scores, round_targets,
                                  attack_fedbary, attack_fedwad, attack_otdd, decode_label_augmented,
                                  estimate_fedbary_times, estimate_time_from_coincidences,
                                  estimate_time_from_distance, estimate_times, estimate_times_from_means,
                                  estimate_times_from_monitor, fedbary_rounds, feature_dim, fedwad_rounds,
                                  interpolant_sources, invert_fedbary_round, invert_interpolation, label_scores,
                                  nn_scale, reconstruct_rounds, reconstruction_scores, server_view)

from otfed.privacy.dp import (DPConfig, DPFedWaDResult, DPWassersteinClient, PrivacyBudgetError,
                              dp_federated_wasserstein, gaussian_epsilon, gaussian_noise_multiplier)

__all__ = [
    "BudgetLedger", "Reservation", "composed_epsilon",
    "CanaryAudit", "DPAttackScores", "MembershipSplits", "canary_audit", "clip_canaries", "dp_attack",
    "membership_auc_interval", "membership_splits", "round_average", "round_likelihood_scores", "round_targets",
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
