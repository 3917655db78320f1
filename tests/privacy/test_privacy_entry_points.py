"""The privacy entry points' docstrings (issue #23): each has a Parameters and a Returns section and a runnable
example, and every example passes — each checks its result against an independent truth: the exact privacy curve
of the composed Gaussian mechanism (μ-GDP, δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)) for the accountant and the
DP FedWaD client, POT's exact ``ot.emd2`` for the noiseless DP estimate, the clients' own samples, labels and
class means for the honest-but-curious server's reconstructions, and brute force over all (member, non-member)
pairs and thresholds for membership inference."""
from __future__ import annotations

from tests.docstring_examples import entry_point_tests

#: (module, function) of every documented entry point
ENTRY_POINTS = [
    ("otfed.privacy.dp", "dp_federated_wasserstein"),
    ("otfed.privacy.dp", "gaussian_epsilon"),
    ("otfed.privacy.dp", "gaussian_noise_multiplier"),
    ("otfed.privacy.attack", "attack_fedwad"),
    ("otfed.privacy.attack", "attack_otdd"),
    ("otfed.privacy.attack", "attack_fedbary"),
    ("otfed.privacy.attack", "attack_experiment"),
    ("otfed.privacy.attack", "dp_attack"),
    ("otfed.privacy.accountant", "BudgetLedger"),
    ("otfed.privacy.membership", "membership_inference"),
]


test_the_entry_points_runnable_example_passes, test_the_entry_point_documents_its_parameters_and_result = \
    entry_point_tests(ENTRY_POINTS)
