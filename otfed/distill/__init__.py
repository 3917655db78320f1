"""KNOT — federated distillation with confident Sinkhorns (KNOT, COLING 2022, and its draft).

K local teachers h_k, trained on private client data, label an unlabelled transfer set; the server
fits a global student h_θ to their predictions with eq. 3, Σ_k W_k(h_k(x)) · T_ε(h_θ(x), h_k(x)), where
T_ε is the entropic OT cost between label histograms under a semantic ground cost (or KL for the
"Entropy" baseline) and W_k a per-sample teacher weight.

Public names (implementation modules in parentheses):

- ``LabelSpace`` — a task's label coordinates (SA, ERC, NLI, one-hot ablation) and
  ``cost_matrix()``                                                                   (label_space)
- ``entropic_histogram_transport(p, q, cost, eps, ...)`` — batched entropic OT between label
  histograms: plan, potentials, values, convergence (``HistogramTransport``)
- ``sinkhorn_histogram_loss(p, q, cost, eps, ...)`` — T_ε for every sample × teacher
  (these three live in :mod:`otfed.ot.entropic_histograms`, re-exported here for KNOT's readers)
- ``weights_A``, ``weights_D``, ``weights_U``, ``weights_E``, ``teacher_weights`` — W_k (weights)
- ``random_texts``, ``probability_bias`` — a teacher's probability bias B_k; ``probability_biases`` —
  the argmax and the soft (mean softmax, an ablation) bias in one pass                  (bias)
- ``ensemble_loss``, ``kl_histogram_loss``, ``teacher_stack`` — eq. 3, the KL baseline and
  the teacher stack with the frozen global model last (learning without forgetting);
  ``mixture_sinkhorn_loss`` — the one-term ablation against the teachers' mixture      (losses)
- ``best_constant``, ``teacher_gate`` — whether a Semantic Distance is any better than a constant
  prediction's, and whether a teacher reads its texts (the module :mod:`otfed.distill.diagnostics` has
  the rest)                                                                           (diagnostics)

Semantic Distance, macro-F1 and accuracy live in :mod:`otfed.metrics`.
"""

from otfed.distill.bias import random_texts, probability_bias, probability_biases
from otfed.distill.diagnostics import best_constant, teacher_gate
from otfed.label_space import LabelSpace
from otfed.distill.losses import ensemble_loss, kl_histogram_loss, mixture_sinkhorn_loss, teacher_stack
from otfed.ot.entropic_histograms import HistogramTransport, entropic_histogram_transport, sinkhorn_histogram_loss
from otfed.distill.weights import teacher_weights, weights_A, weights_D, weights_E, weights_U

__all__ = [
    "LabelSpace",
    "HistogramTransport",
    "entropic_histogram_transport",
    "sinkhorn_histogram_loss",
    "weights_A",
    "weights_D",
    "weights_U",
    "weights_E",
    "teacher_weights",
    "random_texts",
    "probability_bias",
    "probability_biases",
    "ensemble_loss",
    "mixture_sinkhorn_loss",
    "best_constant",
    "teacher_gate",
    "kl_histogram_loss",
    "teacher_stack",
]
