"""The papers' own numbers, in one place, for the results page (``python -m flows.results``).

Quoted verbatim from the papers' text (cited in ``CITATION.cff``; the papers are not in this repository). The
PDF extraction garbles some math; numbers below are copied from the tables and sentences as extracted (e.g.
"10101010" in the raw text is the number 10). Each paper lists the tables / figures the pipeline reproduces; each item names the stage whose
outputs answer it, the view of those outputs (``flows.results.VIEWS``) and the stage's figures.

Item keys: ``ref`` (the paper's table / figure number), ``title``, ``stage`` (DVC stage; ``run`` overrides the
"not run yet" command for outputs no stage writes, e.g. benchmarks), ``folder`` (under ``reports/``),
``quotes`` (verbatim sentences), ``paper_table`` (the paper's numbers: column names + rows), ``views`` (names of
``flows.results.VIEWS``), ``figures`` (files in the folder), ``note`` (how otfed's setting differs), ``headline``
(false: the stage's headline metrics are listed under another paper's section).
"""
from __future__ import annotations

from typing import Any

FEDWAD = {
    "key": "fedwad",
    "title": "FedWaD — Federated Wasserstein Distance (ICLR 2024)",
    "cite": "Rakotomamonjy, Nadjahi & Ralaivola, Federated Wasserstein Distance, ICLR 2024",
    "items": [
        {
            "ref": "Fig. 2",
            "title": "Two Gaussians: relative error vs n",
            "stage": "fed_distance", "folder": "fed_distance",
            "quotes": [
                "It also achieves a similar relative approximation error as FedWaD using the exact interpolating "
                "measure and true non-federated Wasserstein distance.",
            ],
            "views": ["toy_error_at_max_n", "toy_error_at_largest_exact_n"],
            "figures": ["toy_time_error.png"],
            "note": "The paper gives fig. 2 as plots only (support sizes 2, 10, 100; ratio 1:1 and 1:3). otfed's "
                    "relative errors are against the exact empirical W2 (POT) of the same samples. The stage's wall "
                    "times (its seconds column and running-time figure) are in its MLflow run, not in the committed "
                    "reports; the next item times FedWaD in a benchmark.",
        },
        {
            "ref": "Fig. 2 (time)",
            "title": "Two Gaussians: running time vs n",
            "stage": "bench", "folder": "bench", "run": "python -m bench.fedwad_speed",
            "quotes": [
                "The approximated interpolating measure significantly improves computational efficiency, being at "
                "least 10 times faster with sample size exceeding 100, especially with smaller support sizes.",
            ],
            "views": ["fedwad_speed"],
            "figures": ["fedwad_speed.png"],
            "note": "A benchmark, not a DVC stage (wall times do not belong in committed outputs): `make bench`.",
        },
        {
            "ref": "Fig. 3",
            "title": "Convergence of A(k) towards W (2-D Gaussians, 200 points, t = 0.5)",
            "stage": "fed_distance", "folder": "fed_distance",
            "quotes": [
                "the error on the true Wasserstein distance for the approximated interpolating measure reaches 10^-3, "
                "while for the exact interpolating measure, it drops to a minimum of 10^-4 before increasing.",
            ],
            "views": ["convergence_final_gap"],
            "figures": ["convergence.png"],
            "note": "otfed also runs d = 50 and a random t per interpolation (allowed by FedWaD §3; a fixed t = 0.5 "
                    "stalls above W in dimension ≥ 10).",
        },
        {
            "ref": "Fig. 6",
            "title": "Federated OTDD between MNIST, KMNIST, USPS, FashionMNIST",
            "stage": "fed_distance", "folder": "fed_distance",
            "quotes": [
                "the distance matrices produced by FedWaD are semantically similar to the ones for OTDD distance, "
                "which means that order relations are well-preserved for most pairwise distances (except only for "
                "two pairs of datasets in the USPS row).",
                "the exact order relations are already uncovered using only 20 epochs in FedWaD.",
            ],
            "views": ["otdd_pairs"],
            "figures": ["otdd_heatmaps.png"],
            "note": "Paper: 5000 samples per dataset, support 1000 / 5000, 20 / 500 epochs, 5 draws.",
        },
        {
            "ref": "Tables 1–5",
            "title": "Boosting FL: spectral clustering of clients on pairwise federated OTDD",
            "stage": "fed_distance", "folder": "fed_distance",
            "quotes": [
                "We can see that when there is a clear clustering structure among the clients, FedWaD is able to "
                "recover it and always improve the performance of the original federated learning algorithms.",
                "In terms of clustering, the “affinity\" parameter of the spectral clustering algorithm seems to be "
                "the most efficient and robust one.",
            ],
            "paper_table": {
                "caption": "Table 1, MNIST, FedAvg (accuracy %, mean ± sd over 5 trials, support 10)",
                "columns": ["clients", "structure", "Vanilla", "Affinity", "Sparse G. (3)", "Sparse G. (5)"],
                "rows": [
                    [20, "strong", "26.3 ± 3.8", "99.5 ± 0.0", "99.5 ± 0.0", "91.5 ± 10.3"],
                    [20, "none", "25.1 ± 6.6", "71.3 ± 7.3", "59.5 ± 3.0", "57.0 ± 4.4"],
                    [40, "strong", "39.1 ± 9.0", "99.2 ± 0.1", "91.1 ± 6.5", "94.5 ± 9.4"],
                    [40, "none", "42.5 ± 10.5", "70.8 ± 13.5", "60.0 ± 3.7", "58.1 ± 6.3"],
                    [100, "strong", "39.2 ± 7.7", "98.9 ± 0.0", "95.9 ± 4.6", "98.4 ± 0.8"],
                    [100, "none", "52.6 ± 3.9", "64.4 ± 9.6", "76.3 ± 5.4", "67.9 ± 6.0"],
                ],
            },
            "views": ["clustering_ari", "clustered_fl"],
            "figures": ["clustering_pairs_strong.png", "clustering_pairs_none.png", "clustered_fl.png"],
            "note": "otfed: 20 MNIST clients, FedAvg / FedPer / FedRep (MLP 784-64-10, 10 rounds, every client "
                    "in every round) trained globally and within the affinity clusters, scored on each client's "
                    "held-out split, 3 seeds. The paper samples 10% of the clients per round, which is why its "
                    "vanilla FedAvg is far lower.",
        },
        {
            "ref": "Fig. 5, 12",
            "title": "Federated Wasserstein coresets: a global 1-NN classifier over every client's coreset",
            "stage": "fed_distance", "folder": "fed_distance",
            "quotes": [
                "We can see that our simple approach is highly competitive with these personalized FL approaches, "
                "and even outperforms them when the number of users becomes large.",
            ],
            "views": ["coresets"],
            "figures": ["coresets.png"],
            "note": "otfed: 20 clients with 2 MNIST classes each, K = 5 / 10 points per client, features a "
                    "32-component PCA fitted on the server's test split (the paper autoencodes MNIST); the exact "
                    "(non-federated) coreset of each client for reference.",
        },
        {
            "ref": "§3 (privacy)",
            "title": "What an honest-but-curious server rebuilds from the messages; DP FedWaD",
            "stage": "fed_distance", "folder": "fed_distance",
            "quotes": [
                "… are not unique, thus clients can compute these interpolating measures based on a random value "
                "of t.",
                "Besides, since communicating the distance may reveal information about the data, they can be "
                "shared with the server only for the last iteration.",
                "More effectively, one can incorporate an (adapted) differentially private version of the "
                "Wasserstein distance (Lê Tien et al., 2019).",
            ],
            "views": ["privacy_attack", "privacy_dp"],
            "figures": ["privacy.png"],
            "note": "Not an experiment of the paper: the server inverts the interpolating measures it receives "
                    "(otfed.privacy.attack) for clients of pairs_strong (16-component PCA of MNIST), and the DP "
                    "FedWaD client (otfed.privacy.dp) is run against it; reports/fed_distance/privacy_attack.md and "
                    "privacy_dp.md state what the numbers say about each quoted statement.",
        },
    ],
}

FEDBARY = {
    "key": "fedbary",
    "title": "FedBary — Data Valuation and Detections in Federated Learning",
    "cite": ("Li, Fu, Zhang & Pang, Data Valuation and Detections in Federated Learning "
             "(code: github.com/muz1lee/MOTdata)"),
    "items": [
        {
            "ref": "Fig. 4 (scatter)",
            "title": "Client contributions (%) in cases 1–5, with a validation set",
            "stage": "barycenter_valuation", "folder": "valuation",
            "quotes": [
                "For case 1, the result of our distance metric shows that the contributions for all 5 clients are "
                "almost equal, with each of them occupying around 20%",
                "If noise exists in labels of data (case 4), we can expect that the higher the percentage of noisy "
                "labels, the smaller the contribution score is.",
                "FedBary is sensitive to feature noise and could capture the right ordering of client "
                "contributions: with a larger proportion of noise, the contribution score is smaller.",
            ],
            "views": ["contributions", "method_agreement"],
            "figures": ["contributions.png"],
            "note": "Paper: CIFAR-10 (5 clients). otfed: CIFAR-10 cases with 5 × 200 samples, pixels through a "
                    "256-D Gaussian random projection (a 32-component PCA hides the feature noise), 3 seeds; "
                    "GTG-Shapley / MR / DataSV are not built (exact and Monte-Carlo Shapley, LOO are).",
        },
        {
            "ref": "Fig. 4 (histogram)",
            "title": "Without validation: distance of each client to the federated barycenter",
            "stage": "barycenter_valuation", "folder": "valuation",
            "quotes": [
                "We simulate the scenario where there are 4 clients with i.i.d distributions and the 5-th client "
                "with noisy data",
                "the W_p(X̃_5, X̃_Q) is larger than other distances, leading to the conclusion that this dataset is "
                "relatively irrelevant.",
            ],
            "views": ["outlier_distances"],
            "figures": ["outlier_histogram.png"],
        },
        {
            "ref": "Fig. 5, app. 11.3",
            "title": "Noisy-feature / mislabeled data detection and point removal",
            "stage": "barycenter_valuation", "folder": "valuation",
            "quotes": [
                "Corrupt feature samples detections and point Removal Comparison (a,b): FedBary and Lava are "
                "superior; Mislabeled samples detections and point Removal Comparison (c,d): FedBary performs "
                "similarly to Lava and conducts relatively accurate detections",
                "The detection accuracy is 100% in the client side",
                "For the mislabeled data detection, our approach could only detect 45% of noisy data. However, it is "
                "worth noting that when accessing data, the mislabeled detection accuracy is only 47%",
            ],
            "views": ["detection_auc", "detection_f1", "detection_recall"],
            "figures": ["detection.png", "removal_curves.png"],
            "note": "Noise rates 5 / 15 / 30 % as in the paper; otfed flags g > 0 (calibrated gradient) and reports "
                    "F1 and recall of the flags against the ground truth.",
        },
        {
            "ref": "Table 3",
            "title": "Distance under duplication",
            "stage": "barycenter_valuation", "folder": "valuation",
            "quotes": ["We repeated the training set up to three times, and the distance remained unchanged."],
            "paper_table": {
                "caption": "Table 3: Distance behavior under duplications (CIFAR10)",
                "columns": ["Data Size", "Whole Dataset", "One datum"],
                "rows": [["5000", 39.14, 40.94], ["2 × 5000", 39.23, 40.96], ["3 × 5000", 39.18, 40.99]],
            },
            "views": ["duplication"],
            "figures": ["duplication.png"],
        },
        {
            "ref": "Table 4 (app. 11.4)",
            "title": "Boost FL: FedAvg accuracy before / after removing the detected noisy samples",
            "stage": "noisy_removal", "folder": "removal",
            "paper_table": {
                "caption": "Table 4: Accuracy before/after removing detected noisy samples",
                "columns": ["Data", "#Noisy", "#Removed", "acc.before", "acc.after"],
                "rows": [["CIFAR10", 500, 494, 0.67, 0.73], ["Fashion", 1000, 580, 0.56, 0.64]],
            },
            "views": ["removal"],
            "figures": ["removal.png"],
            "note": "otfed: FashionMNIST, 2000 training samples on 5 clients with 200 noisy (label or feature noise), "
                    "3 seeds; the paper's g > 0 rule and a removal budget chosen on the server's validation set.",
        },
        {
            "ref": "Table 2",
            "title": "Evaluation time vs number of clients",
            "stage": "bench", "folder": "bench", "run": "python -m bench.fedbary_scaling",
            "quotes": ["Evaluation time of FedBary increases linearly with N."],
            "paper_table": {
                "caption": "Table 2 (FedBary column: support S = 100 / 500)",
                "columns": ["N", "ExactFed", "GTG", "MR", "DataSV", "Ours (S=100/500)"],
                "rows": [[5, "31m", "33s", "5m", "25m", "1m / 2m"], [10, "3h20m", "7m", "40m", "2h30m", "2m / 4m"],
                         [50, "-", "-", "-", "-", "14m / 30m"], [100, "-", "-", "-", "-", "21m / 1h"]],
            },
            "views": ["fedbary_scaling"],
            "figures": ["fedbary_scaling_blas1.png"],
            "note": "A benchmark, not a DVC stage (wall times do not belong in DVC metrics): `make bench`.",
        },
        {
            "ref": "§4.4",
            "title": "Privacy Guarantee: can the server reconstruct raw training samples?",
            "stage": "fed_distance", "folder": "fed_distance", "headline": False,
            "quotes": [
                "In our setting, privacy is guaranteed from two aspects: (1) Raw training samples cannot be "
                "reconstructed. (2) Generating data with similar appearance is not feasible.",
                "Secondly, hyperparameter t for approximating the interpolating measure, the OT plan between X̃_i "
                "and γ_i, and OT plan between η_Q_i and η_P_i are only known to the client i himself.",
            ],
            "views": ["privacy_attack_fedbary"],
            "note": "Measured by stage fed_distance (FedWaD §3 item: its figure and headline metrics) on the same "
                    "clients; the defence with a guarantee, a DP FedBary client, is the next item.",
        },
        {
            "ref": "§4.4 (defence)",
            "title": "DP FedBary: what a formal guarantee costs noisy-data detection",
            "stage": "barycenter_valuation", "folder": "valuation", "headline": False,
            "quotes": [
                "Raw training samples cannot be reconstructed.",
            ],
            "views": ["privacy_dp_fedbary"],
            "figures": ["privacy_dp_detection.png"],
            "note": "Not in the paper: every client DP (otfed.privacy.dp_fedbary; noisy barycentric targets and "
                    "distances, 2K + 1 Gaussian releases per session, accounted with dp-accounting), noise planted "
                    "as in fig. 5; the datum values stay local and are computed against the noisier η_Q.",
        },
    ],
}

# Paper ALL-column numbers of KNOT tables 2–4 (score, SD) per variant, for the side-by-side view.
KNOT_ALL = {
    "sa": {"Entropy-A": (0.50, 0.79), "Entropy-D": (0.52, 0.78), "Entropy-U": (0.49, 0.83), "Entropy-E": (0.52, 0.75),
           "Sinkhorn-A": (0.52, 0.75), "Sinkhorn-D": (0.52, 0.76), "Sinkhorn-U": (0.49, 0.82),
           "Sinkhorn-E": (0.52, 0.73)},
    "erc": {"Entropy-A": (0.31, 0.64), "Entropy-D": (0.34, 0.62), "Entropy-U": (0.33, 0.64),
            "Entropy-E": (0.39, 0.62), "Sinkhorn-A": (0.34, 0.64), "Sinkhorn-D": (0.39, 0.61),
            "Sinkhorn-U": (0.34, 0.65), "Sinkhorn-E": (0.41, 0.59)},
    "nli": {"Entropy-A": (0.65, 0.53), "Entropy-D": (0.64, 0.53), "Entropy-U": (0.65, 0.53),
            "Entropy-E": (0.65, 0.52), "Sinkhorn-A": (0.64, 0.52), "Sinkhorn-D": (0.63, 0.52),
            "Sinkhorn-U": (0.65, 0.51), "Sinkhorn-E": (0.65, 0.50)},
}


def _knot_all_table() -> dict[str, Any]:
    variants = list(KNOT_ALL["sa"])
    return {"caption": "ALL column of tables 2 (SA, macro-F1), 3 (ERC, macro-F1) and 4 (NLI, accuracy); SD = "
                       "Semantic Distance",
            "columns": ["variant", *[f"{t.upper()} {m}" for t in KNOT_ALL for m in ("score", "SD")]],
            "rows": [[v, *[f"{x:.2f}" for t in KNOT_ALL for x in KNOT_ALL[t][v]]] for v in variants]}


KNOT = {
    "key": "knot",
    "title": "KNOT — Knowledge Distillation using Optimal Transport / Federated confident Sinkhorns",
    "cite": ("KNOT: Knowledge Distillation using Optimal Transport (code: github.com/declare-lab/KNOT), and "
             "Federated Distillation of Natural Language Understanding with Confident Sinkhorns (ICLR submission, "
             "anonymous)"),
    "items": [
        {
            "ref": "Table 1",
            "title": "Local (teacher) models: test score per party",
            "stage": "train_teachers", "folder": "teachers",
            "paper_table": {
                "caption": "Table 1: score (macro-F1 for SA and ERC, accuracy for NLI) of the local models",
                "columns": ["task", "party", "score"],
                "rows": [["SA", "Cell", 0.49], ["SA", "Cloths", 0.52], ["SA", "Toys", 0.49], ["SA", "Food", 0.64],
                         ["ERC", "IEMOCAP", 0.55], ["ERC", "MELD", 0.45], ["ERC", "DyDa{1,2,3}", "0.38, 0.34, 0.40"],
                         ["NLI", "Fic", 0.63], ["NLI", "Gov", 0.65], ["NLI", "Slate", 0.62], ["NLI", "Tele", 0.65],
                         ["NLI", "Trv", 0.63], ["NLI", "SNLI", 0.85]],
            },
            "views": ["teachers"],
            "figures": ["training_curves.png"],
            "note": "Paper: pretrained BERT fine-tuned on the full datasets. otfed (default params): bag-of-word-pieces "
                    "classifiers (one BERT-tiny-shaped and one DistilBERT-shaped party) trained from scratch on a "
                    "CPU on every embedded row of their domain (≤ 2,100 texts), other Amazon categories.",
        },
        {
            "ref": "§5.2, app. D.1",
            "title": "Probability bias B_k of each teacher (argmax shares on random texts)",
            "stage": "estimate_bias", "folder": "bias",
            "quotes": ["We define probability bias B of a local model as the prediction when a model h receives "
                       "random noise at the input.",
                       "we uniformly sample 200 tokens from the vocab with replacement and join them with white space. "
                       "We obtain 100,000 such random texts."],
            "views": ["bias"],
            "figures": ["bias.png"],
            "note": "The paper reports no B_k values.",
        },
        {
            "ref": "Tables 2–4",
            "title": "Distilled global model, ALL test sets: score and Semantic Distance (SD, lower is better)",
            "stage": "distill", "folder": "distill",
            "quotes": [
                "Sinkhorn-A, D, U, and E are more semantically accurate in their predictions as compared to "
                "Entropy-A, D, U, and E, respectively.",
                "we observe that L2 distance ([Method]-E) gives better SD scores amongst the loss groups based on "
                "Entropy and Sinkhorn.",
            ],
            "paper_table": _knot_all_table(),
            "views": ["distill_gate", "distill_all", "distill_claims"],
            "figures": ["sinkhorn_vs_entropy.png", "claims.png"],
            "note": "Paper columns: ALL of table 2 (SA, macro-F1), table 3 (ERC, macro-F1), table 4 (NLI, "
                    "accuracy). otfed's per-test-set tables: reports/distill/table_<task>.csv, for the tasks that "
                    "pass the gate (reports/distill/gate.csv); a task whose teachers do not read their texts is "
                    "'cannot test here' and gets no students.",
        },
        {
            "ref": "Fig. 2",
            "title": "Expected label per ground-truth label, Entropy vs Sinkhorn",
            "stage": "distill", "folder": "distill",
            "quotes": ["we observe the median SD of OT (green box, red line) is closer to the ground truth sentiment "
                       "classes—1,2,3, and 5 as compared to the median SD of Entropy (blue box-red line)."],
            "views": [],
            "figures": ["expected_label_sa.png", "expected_vs_true_sa.png"],
            "note": "SA only: ERC and NLI fail the gate on the default data (no student, no figure).",
        },
    ],
}


PAPERS: list[dict[str, Any]] = [FEDWAD, FEDBARY, KNOT]
