"""Label-augmented optimal transport dataset distance (OTDD; Alvarez-Melis & Fusi 2020), as in FedWaD app. D.3.

The ground cost between labelled samples is d((x, y), (x', y'))² = ||x − x'||² + W₂²(α_y, α_y'), where
α_y is the class-conditional distribution of label y, modelled as a Gaussian N(m_y, Σ_y) so that
W₂²(α_y, α_y') = ||m_y − m_y'||² + Bures²(Σ_y, Σ_y'). The federated version augments each sample to
[x; m_y; vec(Σ_y^{1/2})] and uses the plain squared Euclidean cost on the augmented vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from otfed.errors import DegenerateClientError
from otfed.ot.exact import DEFAULT_NUM_ITERMAX, cost_matrix, exact_plan
from otfed.ot.measures import Measure


@dataclass(frozen=True, eq=False)
class ClassStats:
    """Per-class Gaussian statistics of one data set (FedWaD §5, app. D.3).

    ``labels`` (k,) sorted distinct labels; ``means`` (k, d); ``sqrt_covs`` the covariance square
    roots — (k, d) per-feature standard deviations when ``diagonal``, else (k, d, d) symmetric PSD
    square roots; ``counts`` (k,) samples per class.
    """

    labels: np.ndarray
    means: np.ndarray
    sqrt_covs: np.ndarray
    diagonal: bool
    counts: np.ndarray

    @property
    def dim(self) -> int:
        """Feature dimension d."""
        return int(self.means.shape[1])

    def index_of(self, y: np.ndarray, what: str = "labels") -> np.ndarray:
        """Row index into these statistics of each label in y; ValueError naming unknown labels."""
        y = np.asarray(y)
        idx = np.searchsorted(self.labels, y)
        idx_c = np.clip(idx, 0, len(self.labels) - 1)
        unknown = self.labels[idx_c] != y
        if np.any(unknown):
            missing = sorted(set(np.asarray(y)[unknown].tolist()))
            raise ValueError(
                f"{what} contain label(s) {missing} with no class statistics (known labels: {self.labels.tolist()})"
            )
        return idx_c


def labelled_arrays(x: np.ndarray, y: np.ndarray, client: str = "client") -> tuple[np.ndarray, np.ndarray]:
    """A client's features and labels as arrays, checked before any statistic is taken of them: real, features
    2-D (n, d) with n ≥ 1 and finite, one finite label per sample. Every label-augmented measure (OTDD, FedBary,
    their DP clients) reads its data through this function, so every one refuses the same inputs with the same
    message naming the client.

    Returns:
        ``(x, y)``: float64 features and the labels as given (integers or strings).

    Raises ValueError for complex inputs, features that are not 2-D or labels that are not one per sample;
    :class:`~otfed.errors.DegenerateClientError` for no samples, NaN / inf features or NaN / inf labels.

    >>> x, y = labelled_arrays(np.ones((3, 2), dtype=np.float32), np.array([0, 1, 1]), "alice")
    >>> x.dtype, y.tolist()
    (dtype('float64'), [0, 1, 1])
    """
    if np.iscomplexobj(x) or np.iscomplexobj(y):  # a float64 cast would drop the imaginary part in silence
        raise ValueError(f"client {client!r}: features and labels must be real, got a complex array")
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y)
    if x.ndim != 2:
        raise ValueError(f"client {client!r}: features must be a 2-D (n, d) array, got shape {x.shape}")
    if y.dtype.kind == "f" and not np.all(np.isfinite(y)):  # NaN ≠ NaN: each would be a class of its own
        n_bad = int((~np.isfinite(y)).sum())
        raise DegenerateClientError(f"client {client!r} has NaN or inf labels in {n_bad} sample(s); labels must be "
                                    f"class identifiers (integers or strings)")
    if y.ndim != 1 or y.shape[0] != x.shape[0]:
        raise ValueError(f"client {client!r}: {x.shape[0]} samples but labels have shape {y.shape}")
    if x.shape[0] == 0:
        raise DegenerateClientError(f"client {client!r} has no samples")
    if not np.all(np.isfinite(x)):
        n_bad = int((~np.isfinite(x)).any(axis=1).sum())
        raise DegenerateClientError(f"client {client!r} has NaN or inf features in {n_bad} sample(s)")
    return x, y


def class_statistics(x: np.ndarray, y: np.ndarray, diagonal: bool = True, client: str = "client") -> ClassStats:
    """Per-class mean m_c and covariance square root Σ_c^{1/2} (FedWaD §5, OTDD label embedding).

    Covariances are unbiased (divided by n_c − 1). ``diagonal=True`` stores the per-feature standard
    deviations s_c = √diag(Σ_c): the exact Bures square root of the diagonal Gaussian N(m_c, diag Σ_c),
    so ||s − s'||² is its exact Bures² term. (The FedWaD code instead stores diag(Σ_c^{1/2}), the
    diagonal of the full square root — a different quantity; otdd/MOTdata use √diag(Σ) as here.)
    ``diagonal=False`` stores the symmetric PSD square root V diag(√max(λ, 0)) Vᵀ from ``np.linalg.eigh``.

    Raises :class:`DegenerateClientError` naming ``client`` if x is empty or contains NaN/inf, if a label is NaN
    or inf, or if a class has fewer than 2 samples (its covariance is undefined); ValueError naming ``client`` on
    complex features or labels.

    Parameters:
        x: the features, an (n, d) array.
        y: the n labels (any sortable values).
        diagonal: store per-feature standard deviations (default) or full covariance square roots.
        client: the name errors give.

    Returns:
        A :class:`ClassStats`: the sorted distinct ``labels``, per class its ``means`` (k × d), ``sqrt_covs``
        (k × d, or k × d × d) and ``counts``.

    Against NumPy's unbiased statistics of each class: the mean, the standard deviations (``ddof=1``) and, in
    full mode, a root whose square is ``np.cov``:

    >>> rng = np.random.default_rng(0)
    >>> x, y = rng.normal(size=(12, 2)), np.arange(12) % 3
    >>> stats = class_statistics(x, y)
    >>> stats.labels.tolist(), stats.counts.tolist()
    ([0, 1, 2], [4, 4, 4])
    >>> bool(np.allclose(stats.means[1], x[y == 1].mean(axis=0)))
    True
    >>> bool(np.allclose(stats.sqrt_covs[1], x[y == 1].std(axis=0, ddof=1)))
    True
    >>> root = class_statistics(x, y, diagonal=False).sqrt_covs[1]
    >>> bool(np.allclose(root @ root, np.cov(x[y == 1].T)))
    True
    """
    x, y = labelled_arrays(x, y, client)
    labels, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    small = counts < 2
    if np.any(small):
        detail = ", ".join(f"class {lab!r} has {c} sample{'s' if c != 1 else ''}" for lab, c in zip(labels[small].tolist(), counts[small]))
        raise DegenerateClientError(f"client {client!r}: every class needs at least 2 samples; {detail}")
    k, d = labels.shape[0], x.shape[1]
    means = np.zeros((k, d))
    sqrt_covs = np.zeros((k, d)) if diagonal else np.zeros((k, d, d))
    for c in range(k):
        xc = x[inverse == c]
        m = xc.mean(axis=0)
        z = xc - m
        means[c] = m
        if diagonal:
            sqrt_covs[c] = np.sqrt((z * z).sum(axis=0) / (xc.shape[0] - 1))
        else:
            cov = (z.T @ z) / (xc.shape[0] - 1)
            sqrt_covs[c] = _psd_sqrt(cov)
    return ClassStats(labels=labels, means=means, sqrt_covs=sqrt_covs, diagonal=bool(diagonal), counts=counts)


def _psd_sqrt(A: np.ndarray) -> np.ndarray:
    """Symmetric PSD square root of a symmetric matrix (eigenvalues clamped at 0)."""
    A = 0.5 * (A + A.T)
    lam, V = np.linalg.eigh(A)
    root = (V * np.sqrt(np.clip(lam, 0.0, None))) @ V.T
    return 0.5 * (root + root.T)


def augment_with_label_stats(x: np.ndarray, y: np.ndarray, stats: ClassStats) -> np.ndarray:
    """Label-augmented samples [x; m_y; vec(Σ_y^{1/2})] (diagonal mode: [x; m_y; s_y]) — FedWaD §5, app. D.3.

    Squared Euclidean distances between augmented rows equal ||x − x'||² + ||m − m'||² + ||S − S'||_F²,
    which is :func:`otdd_ground_cost` exactly in diagonal mode (and for commuting covariances) and an
    upper bound on it otherwise. Raises ValueError if y holds a label without statistics.

    Parameters:
        x: the features, an (n, d) array of the statistics' dimension d.
        y: the n labels, each with statistics in ``stats``.
        stats: the data set's :func:`class_statistics`.

    Returns:
        The (n, 3d) array [x; m_y; s_y] (diagonal mode) or the (n, 2d + d²) array [x; m_y; vec Σ_y^{1/2}].

    In diagonal mode the squared distances of augmented rows are the OTDD ground cost, built by hand here from
    NumPy's class means and standard deviations:

    >>> rng = np.random.default_rng(0)
    >>> x, y = rng.normal(size=(6, 2)), np.arange(6) % 2
    >>> z = augment_with_label_stats(x, y, class_statistics(x, y))
    >>> s = {c: np.concatenate([x[y == c].mean(axis=0), x[y == c].std(axis=0, ddof=1)]) for c in (0, 1)}
    >>> z.shape, bool(np.isclose(np.sum((z[0] - z[3]) ** 2), np.sum((x[0] - x[3]) ** 2) + np.sum((s[0] - s[1]) ** 2)))
    ((6, 6), True)
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != stats.dim:
        raise ValueError(f"features of shape {x.shape} do not match class statistics of dimension {stats.dim}")
    idx = stats.index_of(y)
    roots = stats.sqrt_covs.reshape(stats.sqrt_covs.shape[0], -1)
    return np.hstack([x, stats.means[idx], roots[idx]])


def _check_compatible(stats_s: ClassStats, stats_t: ClassStats) -> None:
    if stats_s.diagonal != stats_t.diagonal:
        raise ValueError("class statistics mix diagonal and full covariance modes")
    if stats_s.dim != stats_t.dim:
        raise ValueError(f"class statistics have different dimensions: {stats_s.dim} vs {stats_t.dim}")


def label_cost(stats_s: ClassStats, stats_t: ClassStats) -> np.ndarray:
    """W₂²(N(m, Σ), N(m', Σ')) = ||m − m'||² + Bures²(Σ, Σ') between all class pairs (k_s × k_t).

    Bures²(A, B) = tr A + tr B − 2 tr (A^{1/2} B A^{1/2})^{1/2}; with S = A^{1/2}, S' = B^{1/2} the last
    trace is the nuclear norm of S S' (the square roots of the eigenvalues of S S'² S). Diagonal mode:
    ||s − s'||² with s the per-feature standard deviations (exact for diagonal Gaussians).
    Rows follow ``stats_s.labels``, columns ``stats_t.labels``.

    Parameters:
        stats_s, stats_t: the two data sets' :func:`class_statistics`, both diagonal or both full, of one
            feature dimension.

    Returns:
        The k_s × k_t array of W₂² between the class Gaussians.

    Raises ValueError when the statistics mix diagonal and full mode or differ in dimension.

    Against POT's closed-form Gaussian W₂ (``ot.gaussian.bures_wasserstein_distance``) between two classes'
    Gaussians N(m, Σ) with NumPy's mean and covariance:

    >>> from ot.gaussian import bures_wasserstein_distance
    >>> rng = np.random.default_rng(0)
    >>> xs, ys = rng.normal(size=(12, 2)), np.arange(12) % 3
    >>> xt, yt = rng.normal(size=(10, 2)) + 1.0, np.arange(10) % 2
    >>> cost = label_cost(class_statistics(xs, ys, diagonal=False), class_statistics(xt, yt, diagonal=False))
    >>> s, t = xs[ys == 0], xt[yt == 1]
    >>> w2 = float(bures_wasserstein_distance(s.mean(0), t.mean(0), np.cov(s.T), np.cov(t.T)))
    >>> cost.shape, bool(np.isclose(cost[0, 1], w2 ** 2))
    ((3, 2), True)
    """
    _check_compatible(stats_s, stats_t)
    mean_term = cost_matrix(stats_s.means, stats_t.means, 2)
    if stats_s.diagonal:
        return mean_term + cost_matrix(stats_s.sqrt_covs, stats_t.sqrt_covs, 2)
    tr_s = np.einsum("kij,kij->k", stats_s.sqrt_covs, stats_s.sqrt_covs)
    tr_t = np.einsum("kij,kij->k", stats_t.sqrt_covs, stats_t.sqrt_covs)
    bures = np.empty((stats_s.labels.shape[0], stats_t.labels.shape[0]))
    for i, root_s in enumerate(stats_s.sqrt_covs):
        products = np.matmul(root_s[None, :, :], stats_t.sqrt_covs)  # (k_t, d, d)
        nuclear = np.linalg.svd(products, compute_uv=False).sum(axis=-1)
        bures[i] = tr_s[i] + tr_t - 2.0 * nuclear
        same = np.all(stats_t.sqrt_covs == root_s[None, :, :], axis=(1, 2))
        bures[i, same] = 0.0  # Bures(A, A) = 0 exactly; avoids a rounding residue of ~1e-16·tr A
    return mean_term + np.maximum(bures, 0.0)


def otdd_ground_cost(
    xs: np.ndarray, ys: np.ndarray, stats_s: ClassStats, xt: np.ndarray, yt: np.ndarray, stats_t: ClassStats
) -> np.ndarray:
    """OTDD pair cost M_ij = ||x_i − x'_j||² + W₂²(α_{y_i}, α'_{y'_j}) (FedWaD app. D.3).

    Parameters:
        xs, ys: the source features (n × d) and labels.
        stats_s: the source's :func:`class_statistics`.
        xt, yt: the target features (m × d) and labels.
        stats_t: the target's :func:`class_statistics` (the same mode and dimension).

    Returns:
        The n × m cost matrix M.

    Raises ValueError for a label without class statistics, or statistics of different modes or dimensions.

    Built by hand in diagonal mode — squared feature distance plus ||m − m'||² + ||s − s'||² of the two
    samples' classes, with NumPy's means and standard deviations:

    >>> rng = np.random.default_rng(0)
    >>> xs, ys = rng.normal(size=(6, 2)), np.arange(6) % 2
    >>> xt, yt = rng.normal(size=(4, 2)) + 1.0, np.arange(4) % 2
    >>> M = otdd_ground_cost(xs, ys, class_statistics(xs, ys), xt, yt, class_statistics(xt, yt))
    >>> def label(x, y, c):
    ...     return np.concatenate([x[y == c].mean(axis=0), x[y == c].std(axis=0, ddof=1)])
    >>> by_hand = [[np.sum((a - b) ** 2) + np.sum((label(xs, ys, c) - label(xt, yt, e)) ** 2)
    ...             for b, e in zip(xt, yt)] for a, c in zip(xs, ys)]
    >>> M.shape, bool(np.allclose(M, by_hand))
    ((6, 4), True)
    """
    L = label_cost(stats_s, stats_t)
    idx_s = stats_s.index_of(ys, "source labels")
    idx_t = stats_t.index_of(yt, "target labels")
    return cost_matrix(xs, xt, 2) + L[np.ix_(idx_s, idx_t)]


def otdd_exact(
    xs: np.ndarray,
    ys: np.ndarray,
    xt: np.ndarray,
    yt: np.ndarray,
    diagonal: bool = True,
    num_itermax: int = DEFAULT_NUM_ITERMAX,
) -> float:
    """Exact (non-federated) OTDD = sqrt(min_{P ∈ Π(u_n, u_m)} <P, M>) with M from :func:`otdd_ground_cost`.

    Uniform weights on both data sets, each using its own class statistics (:func:`class_statistics`),
    solved by the network simplex (:func:`otfed.ot.exact_plan`). This is the reference the federated
    OTDD (FedWaD on augmented vectors) is compared against (FedWaD app. D.4).

    Parameters:
        xs, ys: the source data set, features (n × d) and labels (every class with ≥ 2 samples).
        xt, yt: the target data set, features (m × d) and labels.
        diagonal: class covariances as per-feature standard deviations (default) or full square roots.
        num_itermax: the network simplex's iteration cap.

    Returns:
        The OTDD as a float (the square root of the optimal cost).

    Raises :class:`DegenerateClientError` (source / target) for an empty or non-finite data set or a class with
    fewer than 2 samples.

    Closed form: translating a labelled data set by v moves its features and its class means by v and keeps
    its covariances, so its label-augmented measure is translated by (v, v, 0) and the OTDD is √2·||v||, in
    both modes. Otherwise it is POT's exact ``ot.emd2`` on :func:`otdd_ground_cost`:

    >>> import ot
    >>> rng = np.random.default_rng(0)
    >>> xs, ys, v = rng.normal(size=(12, 2)), np.arange(12) % 3, np.array([0.5, -1.0])
    >>> bool(np.isclose(otdd_exact(xs, ys, xs + v, ys), np.sqrt(2) * np.linalg.norm(v)))
    True
    >>> bool(np.isclose(otdd_exact(xs, ys, xs + v, ys, diagonal=False), np.sqrt(2) * np.linalg.norm(v)))
    True
    >>> xt, yt = rng.normal(size=(10, 2)) + 1.0, np.arange(10) % 2
    >>> M = otdd_ground_cost(xs, ys, class_statistics(xs, ys), xt, yt, class_statistics(xt, yt))
    >>> bool(np.isclose(otdd_exact(xs, ys, xt, yt), np.sqrt(ot.emd2(np.full(12, 1 / 12), np.full(10, 1 / 10), M))))
    True
    """
    stats_s = class_statistics(xs, ys, diagonal=diagonal, client="source")
    stats_t = class_statistics(xt, yt, diagonal=diagonal, client="target")
    M = otdd_ground_cost(xs, ys, stats_s, xt, yt, stats_t)
    n, m = M.shape
    plan = exact_plan(np.full(n, 1.0 / n), np.full(m, 1.0 / m), M, num_itermax=num_itermax)
    return float(np.sqrt(max(float((plan * M).sum()), 0.0)))


@dataclass(frozen=True)
class LabelledData:
    """One client's private labelled dataset (stays on the client)."""

    name: str
    x: np.ndarray
    y: np.ndarray


def augmented_measure(data: LabelledData, diagonal: bool = True) -> Measure:
    """Client-side: the uniform measure on label-augmented samples [x; m_y; vec(Σ_y^{1/2})].

    Raises DegenerateClientError naming the client if it has no samples, NaN/inf features or labels, or a class
    with fewer than two samples (its covariance is undefined); ValueError as :func:`labelled_arrays`.
    """
    x, y = labelled_arrays(data.x, data.y, data.name)
    stats = class_statistics(x, y, diagonal=diagonal, client=data.name)
    return Measure.uniform(augment_with_label_stats(x, y, stats))
