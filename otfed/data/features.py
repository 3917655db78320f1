"""Image → feature vectors: pixel features (with optional bilinear resize), server-side PCA, and a
finiteness check.

Pixel features are the raw-pixel embedding both FedWaD's OTDD experiments (FedWaD app. D.4–D.5: the
original data space; here MNIST vs USPS at 28×28) and FedBary's label-augmented vectors x̃ = [x; m_y; vec(Σ_y^{1/2})]
(FedBary §4.1) start from. PCA is optional and only reduces the dimension before the OT solvers.
"""

from __future__ import annotations

import numpy as np
from sklearn.decomposition import PCA

from otfed.errors import ConfigError, DegenerateClientError


def bilinear_resize_matrix(n_in: int, n_out: int) -> np.ndarray:
    """The (n_out, n_in) matrix of 1-D linear interpolation with half-pixel centres.

    Output pixel j samples the input at s = (j + 0.5)·n_in/n_out − 0.5 (clamped at 0 and n_in − 1),
    the convention of ``torch.nn.functional.interpolate(mode="bilinear", align_corners=False)``
    without antialiasing. Each row is a convex combination (non-negative weights summing to 1).
    """
    if n_in < 1 or n_out < 1:
        raise ValueError(f"sizes must be positive, got n_in={n_in}, n_out={n_out}")
    src = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    src = np.clip(src, 0.0, n_in - 1)
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = src - lo
    m = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    np.add.at(m, (rows, lo), 1.0 - frac)
    np.add.at(m, (rows, hi), frac)
    return m


def pixel_features(images: np.ndarray, size: int | None = None) -> np.ndarray:
    """Flattened pixel features in [0, 1] as float64, shape (n, size·size·C).

    ``images`` is uint8, (n, H, W) or (n, H, W, C) (channels last). Pixels are scaled by 1/255; with
    ``size`` the images are first bilinearly resized to size×size (half-pixel centres, as torch's
    ``interpolate(..., mode="bilinear", align_corners=False)``), e.g. USPS 16×16 → 28×28 to share
    MNIST's ground space (FedWaD OTDD experiments, app. D.4). Channels-last images are flattened over
    (row, column, channel), so feature index = (r·W + c)·C + ch.
    """
    images = np.asarray(images)
    if images.ndim not in (3, 4):
        raise ValueError(f"images must have shape (n, H, W) or (n, H, W, C); got {images.shape}")
    if images.dtype != np.uint8:
        raise ValueError(f"images must be uint8 (0..255); got dtype {images.dtype}")
    x = images.astype(np.float64) / 255.0
    if size is not None:
        if size < 1:
            raise ValueError(f"size must be a positive integer, got {size}")
        h, w = x.shape[1], x.shape[2]
        if (h, w) != (size, size):
            rh, rw = bilinear_resize_matrix(h, size), bilinear_resize_matrix(w, size)
            if x.ndim == 3:
                x = np.einsum("ih,nhw,jw->nij", rh, x, rw, optimize=True)
            else:
                x = np.einsum("ih,nhwc,jw->nijc", rh, x, rw, optimize=True)
            np.clip(x, 0.0, 1.0, out=x)  # convex combinations; clip only removes rounding error
    return x.reshape(x.shape[0], -1)


def fit_pca(x_reference: np.ndarray, n_components: int, seed: int) -> PCA:
    """Fit a PCA with ``n_components`` components on server-side public data.

    Privacy boundary (FedWaD §3, FedBary §4.4: the server never sees client samples): the reference must be data the
    server holds anyway — the dataset's official *test* split — never client training data. The
    fitted projection is then shipped to clients, which apply :func:`reduce_features` locally.
    ``seed`` fixes sklearn's randomized SVD so the same inputs give the same components.
    """
    x_reference = check_finite(np.asarray(x_reference, dtype=np.float64), "PCA reference data")
    if x_reference.ndim != 2:
        raise ValueError(f"x_reference must be 2-D (n, D); got shape {x_reference.shape}")
    n, d = x_reference.shape
    if not 1 <= n_components <= min(n, d):
        raise ValueError(f"n_components must lie in 1..min(n, D) = 1..{min(n, d)}; got {n_components}")
    return PCA(n_components=n_components, random_state=seed).fit(x_reference)


def check_pca_components(n_components: int, n_rows: int, n_features: int, key: str, reference: str) -> None:
    """ConfigError naming the params ``key`` unless a PCA of ``n_components`` components can be fitted on
    ``reference`` (``n_rows`` rows of ``n_features`` features): scikit-learn's PCA takes at most
    min(n_rows, n_features) components (:func:`fit_pca` refuses more, but only once a stage's task runs)."""
    most = min(n_rows, n_features)
    if n_components > most:
        raise ConfigError(f"{key}: {n_components} components, but the PCA is fitted on {reference}: {n_rows} rows of "
                          f"{n_features} features; at most {most}", keys=(key,))


def reduce_features(x: np.ndarray, pca: PCA) -> np.ndarray:
    """Project ``x`` (n, D) onto the components of a PCA from :func:`fit_pca`; float64 (n, k) — (0, k) for no
    rows (scikit-learn's transform refuses an empty array)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != pca.n_features_in_:
        raise ValueError(f"x must have shape (n, {pca.n_features_in_}) to match the PCA; got {x.shape}")
    if x.shape[0] == 0:
        return np.zeros((0, pca.n_components_))
    return np.asarray(pca.transform(x), dtype=np.float64)


def check_finite(x: np.ndarray, what: str) -> np.ndarray:
    """Return ``x`` unchanged if every entry is finite; otherwise raise DegenerateClientError.

    The message names ``what`` (e.g. "client 3 features") and how many rows hold NaN or ±inf.
    """
    x = np.asarray(x)
    finite = np.isfinite(x)
    if not finite.all():
        bad_rows = int((~finite.reshape(x.shape[0], -1)).any(axis=1).sum()) if x.ndim > 1 else int((~finite).sum())
        n_rows = x.shape[0] if x.ndim else 1
        raise DegenerateClientError(f"{what}: {bad_rows} of {n_rows} rows contain NaN or inf values")
    return x
