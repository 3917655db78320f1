"""Pixel features against direct pixel reads, torch's bilinear interpolation and hand values; PCA
against the geometry it must preserve; the finiteness check."""

from pathlib import Path

import numpy as np
import pytest
import torch

from otfed.data import check_finite, fit_pca, load_images, pixel_features, reduce_features
from otfed.errors import DegenerateClientError

RAW = Path(__file__).resolve().parents[2] / "data" / "raw"


def test_grey_pixels_are_scaled_and_flattened_row_major():
    images = load_images("mnist", "test", RAW).images
    x = pixel_features(images)
    assert x.shape == (1000, 784) and x.dtype == np.float64
    for n, r, c in [(0, 14, 14), (3, 5, 20), (999, 27, 0)]:
        assert x[n, r * 28 + c] == images[n, r, c] / 255.0
    assert x.min() >= 0.0 and x.max() <= 1.0


def test_colour_pixels_flatten_channels_last():
    images = load_images("cifar10", "test", RAW).images[:10]
    x = pixel_features(images)
    assert x.shape == (10, 32 * 32 * 3)
    for n, r, c, ch in [(0, 0, 0, 0), (4, 10, 31, 2), (9, 31, 5, 1)]:
        assert x[n, (r * 32 + c) * 3 + ch] == images[n, r, c, ch] / 255.0


def test_bilinear_upsampling_hand_values():
    # 2x2 -> 4x4, half-pixel centres: sample points -0.25 (clamped to 0), 0.25, 0.75, 1.25 (clamped to 1).
    img = np.array([[[0, 255], [0, 255]]], dtype=np.uint8)
    x = pixel_features(img, size=4).reshape(4, 4)
    np.testing.assert_allclose(x, np.tile([0.0, 0.25, 0.75, 1.0], (4, 1)), atol=1e-15)


@pytest.mark.parametrize("name,size", [("usps", 28), ("mnist", 16), ("cifar10", 20)])
def test_resize_matches_torch_bilinear(name, size):
    images = load_images(name, "test", RAW).images[:50]
    x = pixel_features(images, size=size)
    t = torch.from_numpy(images.astype(np.float64) / 255.0)
    t = t.unsqueeze(1) if t.ndim == 3 else t.permute(0, 3, 1, 2)
    ref = torch.nn.functional.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)
    ref = ref.squeeze(1) if images.ndim == 3 else ref.permute(0, 2, 3, 1)
    np.testing.assert_allclose(x, ref.reshape(50, -1).numpy(), atol=1e-12)


def test_usps_resized_to_mnist_grid():
    x = pixel_features(load_images("usps", "train", RAW).images, size=28)
    assert x.shape == (5000, 784)
    assert x.min() >= 0.0 and x.max() <= 1.0
    # Same native size: resizing is the identity.
    img = load_images("mnist", "test", RAW).images[:5]
    np.testing.assert_array_equal(pixel_features(img, size=28), pixel_features(img))


def test_pca_on_low_rank_data_is_exact_and_seeded():
    rng = np.random.default_rng(0)
    basis = rng.normal(size=(3, 40))
    reference = rng.normal(size=(200, 3)) @ basis + 5.0
    clients = rng.normal(size=(30, 3)) @ basis + 5.0
    pca = fit_pca(reference, 3, seed=1)
    z = reduce_features(clients, pca)
    assert z.shape == (30, 3) and z.dtype == np.float64
    # Data in the span of the reference is reconstructed exactly, so pairwise distances are kept.
    np.testing.assert_allclose(pca.inverse_transform(z), clients, atol=1e-9)
    d_full = np.linalg.norm(clients[:, None] - clients[None], axis=-1)
    d_red = np.linalg.norm(z[:, None] - z[None], axis=-1)
    np.testing.assert_allclose(d_red, d_full, atol=1e-9)
    np.testing.assert_array_equal(reduce_features(clients, fit_pca(reference, 3, seed=1)), z)
    with pytest.raises(ValueError, match="shape"):
        reduce_features(clients[:, :10], pca)
    with pytest.raises(ValueError, match="n_components"):
        fit_pca(reference, 41, seed=1)


def test_check_finite_names_the_thing_and_counts_rows():
    x = np.zeros((6, 4))
    assert check_finite(x, "client 2 features") is x
    x[1, 0], x[4, 3], x[4, 2] = np.nan, np.inf, -np.inf
    with pytest.raises(DegenerateClientError, match=r"client 2 features: 2 of 6 rows contain NaN or inf"):
        check_finite(x, "client 2 features")
