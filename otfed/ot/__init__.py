"""Optimal-transport primitives used by FedWaD, federated OTDD, FedBary and KNOT.

Public names (implementation modules in parentheses):

- ``Measure`` — a discrete measure (support, weights)                                   (measures)
- ``cost_matrix(X, Y, p)`` — ground cost ||x − y||^p, p ∈ {1, 2}                        (exact)
- ``exact_plan(a, b, M, num_itermax, method, potentials)`` — network simplex (dense, or
  on a few arcs priced against all: ``pricing_plan``), raises OTConvergenceError        (exact)
- ``wasserstein(X, Y, a, b, p, num_itermax)`` — exact W_p                               (exact)
- ``Transport``, ``optimal_transport(mu, nu, p, solver)`` — plan + W_p, solver dispatch (exact)
- ``semidual_plan(a, b, M, eps_rel, tol, max_newton, g_init)`` — fast entropic
  semi-dual Newton solver for small-vs-large problems (FedWaD subproblems)               (semidual)
- ``entropic_histogram_transport(p, q, cost, eps, ...)`` — batched entropic OT (torch)
  between histograms on one label support: plan, potentials, values, convergence
  (``HistogramTransport``); ``sinkhorn_histogram_loss`` — KNOT's T_ε, differentiable   (entropic_histograms)
- ``interpolate_exact``, ``interpolate_approx``, ``interpolating_measure`` — FedWaD
  interpolating measures, eqs. 5 and 10                                                 (interpolation)
- ``ClassStats``, ``class_statistics``, ``augment_with_label_stats``, ``label_cost``,
  ``otdd_ground_cost``, ``otdd_exact`` — label-augmented OTDD                            (otdd)
- ``gelbrich_bound(m1, S1, m2, S2)`` — Gelbrich's lower bound of W₂ from means and
  covariances; ``bures_squared``, ``measure_moments``, ``psd_sqrt``; ``gaussian_potentials``
  — dual potentials of W₂² from the Gaussian map, pricing's first arcs                  (gelbrich)

The torch-based names (``HistogramTransport``, ``entropic_histogram_transport``, ``sinkhorn_histogram_loss``) are
imported on first use (PEP 562): FedWaD, OTDD and FedBary run without torch (the core install). Code that needs
them imports :mod:`otfed.ot.entropic_histograms` itself. FedBary's entropic potentials come from
:func:`otfed.ot.semidual.entropic_potentials` (Newton on the semi-dual, stopping on the potentials' remaining change;
:func:`otfed.valuation.calibrated.dual_potential`).
"""
import importlib

from otfed.ot.exact import Transport, cost_matrix, exact_plan, optimal_transport, pricing_plan, wasserstein
from otfed.ot.gelbrich import bures_squared, gaussian_potentials, gelbrich_bound, measure_moments, psd_sqrt
from otfed.ot.interpolation import interpolate_approx, interpolate_exact, interpolating_measure
from otfed.ot.measures import Measure
from otfed.ot.otdd import (
    ClassStats,
    augment_with_label_stats,
    class_statistics,
    label_cost,
    otdd_exact,
    otdd_ground_cost,
)
from otfed.ot.semidual import semidual_plan

__all__ = [
    "Measure",
    "cost_matrix",
    "exact_plan",
    "pricing_plan",
    "gaussian_potentials",
    "wasserstein",
    "Transport",
    "optimal_transport",
    "semidual_plan",
    "HistogramTransport",
    "entropic_histogram_transport",
    "sinkhorn_histogram_loss",
    "interpolate_exact",
    "interpolate_approx",
    "interpolating_measure",
    "ClassStats",
    "class_statistics",
    "augment_with_label_stats",
    "label_cost",
    "otdd_ground_cost",
    "otdd_exact",
    "gelbrich_bound",
    "bures_squared",
    "measure_moments",
    "psd_sqrt",
]

_TORCH_NAMES = frozenset({"HistogramTransport", "entropic_histogram_transport", "sinkhorn_histogram_loss"})


def __getattr__(name: str):
    """The torch-based names of :mod:`otfed.ot.entropic_histograms`, imported when first asked for."""
    if name in _TORCH_NAMES:
        return getattr(importlib.import_module("otfed.ot.entropic_histograms"), name)
    raise AttributeError(f"module 'otfed.ot' has no attribute {name!r}")

