"""Supervised training of a text classifier (KNOT §6 and app. H: cross-entropy, Adam)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from torch import nn

from otfed.errors import DegenerateClientError
from otfed.metrics import accuracy, macro_f1
from otfed.models import EPOCH_KEYS, TrainingConfig, build_classifier, predict_labels, seeded_dropout, train_classifier
from otfed.models.training import GeneratorDropout, _seeded_attention

LABELS = ("neg", "pos")


def fast(**fields) -> TrainingConfig:
    """Small batches and a high learning rate: the separable task is learnt in a few epochs."""
    return TrainingConfig(batch_size=16, lr=2e-3, **fields)


def weights(clf) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in clf.model.state_dict().items()}


def equal(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_learns_a_separable_task_and_reports_epochs(task, tiny_spec):
    tr, ytr, va, yva = task
    clf = build_classifier(tiny_spec, LABELS, tr, seed=0)
    records = []
    result = train_classifier(clf, tr, ytr, va, yva, fast(epochs=8, patience=None), seed=0,
                              on_epoch=records.append, progress=False)
    assert [r["epoch"] for r in records] == list(range(1, 9))  # once per epoch, in order
    assert all(tuple(r) == EPOCH_KEYS for r in records)
    assert records == result.history
    assert result.best_score == pytest.approx(1.0)
    # best_score is the validation macro-F1 of the restored weights, recomputed independently
    predicted = predict_labels(clf, va)
    assert macro_f1(yva, predicted, n_labels=2) == result.best_score
    assert records[result.best_epoch - 1]["val_accuracy"] == accuracy(yva, predicted)
    assert records[-1]["train_loss"] < records[0]["train_loss"]
    assert not clf.model.training


def test_early_stopping_restores_the_best_epoch(task, tiny_spec):
    tr, ytr, va, yva = task
    clf = build_classifier(tiny_spec, LABELS, tr, seed=0)
    snapshots = {}
    result = train_classifier(clf, tr, ytr, va, yva, fast(epochs=30, patience=2), seed=0,
                              on_epoch=lambda r: snapshots.__setitem__(r["epoch"], weights(clf)), progress=False)
    # F1 cannot beat 1.0, so training stops `patience` epochs after the first perfect epoch
    assert result.best_score == 1.0
    assert result.epochs_run == result.best_epoch + 2 < 30
    assert equal(weights(clf), snapshots[result.best_epoch])
    assert not equal(weights(clf), snapshots[result.epochs_run])


@pytest.mark.parametrize("kind", ["bert", "distilbert"])
def test_same_seed_same_weights_and_no_global_rng(task, tiny_spec, kind):
    tr, ytr, va, yva = task
    spec = tiny_spec.model_copy(update=dict(kind=kind, dropout=0.3))  # dropout matters
    runs = []
    for global_seed, seed in [(1, 5), (2, 5), (1, 6)]:
        torch.manual_seed(global_seed)  # other threads may move torch's global RNG at any time
        clf = build_classifier(spec, LABELS, tr, seed=0)
        result = train_classifier(clf, tr, ytr, va, yva, fast(epochs=2, patience=None), seed=seed, progress=False)
        runs.append((weights(clf), [r["train_loss"] for r in result.history]))
    assert equal(runs[0][0], runs[1][0]) and runs[0][1] == runs[1][1]
    assert not equal(runs[0][0], runs[2][0])


def test_bad_inputs(task, tiny_spec):
    tr, ytr, va, yva = task
    clf = build_classifier(tiny_spec, LABELS, tr, seed=0)
    with pytest.raises(ValueError, match="0..1"):
        train_classifier(clf, tr, [2] * len(tr), va, yva, TrainingConfig(epochs=1), progress=False)
    with pytest.raises(ValueError, match="one label per text"):
        train_classifier(clf, tr, ytr[:-1], va, yva, TrainingConfig(epochs=1), progress=False)
    with pytest.raises(DegenerateClientError, match="client 3: no validation texts"):
        train_classifier(clf, tr, ytr, [], [], TrainingConfig(epochs=1), progress=False, description="client 3")


# --------------------------------------------------------------------------------- seeded dropout
def test_seeded_dropout_leaves_the_global_rng_alone_and_is_reproducible(task, tiny_spec):
    clf = build_classifier(tiny_spec.model_copy(update=dict(dropout=0.5)), LABELS, task[0], seed=0)
    batch = clf.encode(task[0][:8])
    clf.model.eval()
    with torch.no_grad():
        plain = clf.logits(batch)
    clf.model.train()
    outputs = []
    for _ in range(2):
        with torch.no_grad(), seeded_dropout(clf.model, torch.Generator().manual_seed(3)):
            swapped = [m for m in clf.model.modules() if isinstance(m, GeneratorDropout)]
            assert len(swapped) == 5  # embeddings, attention probs, attention output, layer output, classifier
            before = torch.get_rng_state()
            outputs.append(clf.logits(batch))
            assert torch.equal(before, torch.get_rng_state())
    assert torch.equal(outputs[0], outputs[1])
    assert not torch.allclose(outputs[0], plain)  # dropout was active
    assert not any(isinstance(m, GeneratorDropout) for m in clf.model.modules())  # everything put back
    assert clf.model.config._attn_implementation == "sdpa"
    clf.model.eval()


def test_seeded_attention_matches_sdpa_when_nothing_is_dropped():
    # With p → 0 the explicit (dropout-capable) path must equal transformers' SDPA attention, padding mask included.
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 4, generator=g) for _ in range(3))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    mask[1, :, :, 3:] = False  # the second sequence has two padding tokens
    module = nn.Module()
    module.dropout = GeneratorDropout(1e-12, torch.Generator().manual_seed(1))
    module.is_causal = False
    module.train()
    got, _ = _seeded_attention(module, q, k, v, mask, dropout=1e-12, scaling=0.5)
    expected, _ = sdpa_attention_forward(module, q, k, v, mask, dropout=0.0, scaling=0.5)
    torch.testing.assert_close(got, expected)


def test_parallel_threads_train_as_if_alone(task, tiny_spec):
    # Stages train parties in threads of one process: a party's weights must not depend on the others.
    tr, ytr, va, yva = task
    spec = tiny_spec.model_copy(update=dict(dropout=0.3))

    def train(seed: int) -> dict[str, torch.Tensor]:
        clf = build_classifier(spec, LABELS, tr, seed=seed)
        train_classifier(clf, tr, ytr, va, yva, fast(epochs=2, patience=None), seed=seed, progress=False)
        return weights(clf)

    alone = train(5)
    with ThreadPoolExecutor(max_workers=2) as pool:
        together = list(pool.map(train, [5, 6]))
    assert equal(together[0], alone)
    assert not equal(together[1], alone)


def test_epoch_loss_is_the_host_sum_it_replaces_bit_for_bit():
    """Σ float(loss)·|B| / n in Python floats (what the loop computed before) equals the on-device float64 sum."""
    from otfed.models.training import EpochLoss

    g = torch.Generator().manual_seed(0)
    losses = torch.rand(200, generator=g, dtype=torch.float32) * 3
    sizes = [int(s) for s in torch.randint(1, 33, (200,), generator=g)]
    host, meter = 0.0, EpochLoss()
    for loss, size in zip(losses, sizes):
        host += float(loss) * size
        meter.add(loss, size)
    assert meter.seen == sum(sizes)
    assert meter.mean() == host / sum(sizes)  # exact: same widening, products and additions in the same order
    with pytest.raises(ValueError, match="no batch"):
        EpochLoss().mean()


def test_epoch_loss_shows_at_most_once_per_interval_and_never_on_a_disabled_bar():
    from otfed.models.training import EpochLoss

    class Bar:
        def __init__(self, disable: bool) -> None:
            self.disable, self.postfixes = disable, []

        def set_postfix(self, **kwargs) -> None:
            self.postfixes.append(kwargs)

    meter = EpochLoss(interval=0.0)
    meter.add(torch.tensor(2.0), 4)
    shown, hidden = Bar(False), Bar(True)
    meter.show(shown)
    meter.show(hidden)
    assert shown.postfixes == [{"loss": "2.0000"}] and hidden.postfixes == []
    slow = EpochLoss(interval=3600.0)
    slow.add(torch.tensor(1.0), 1)
    for _ in range(5):
        slow.show(shown)
    assert len(shown.postfixes) == 1  # within the hour: no further read-back


# ------------------------------------------------------------------------------ class-balanced loss
def test_class_weights_by_hand():
    from otfed.models.training import class_weights

    # n = 6 labels over C = 4 columns, 3 present with counts 3, 1, 2: w_c = 6 / (3 · n_c); absent label 3 → 0
    w = class_weights([0, 0, 2, 1, 0, 2], 4)
    assert w.tolist() == pytest.approx([6 / 9, 2.0, 1.0, 0.0])
    assert w[[0, 0, 2, 1, 0, 2]].sum() == pytest.approx(6.0)  # mean example weight 1
    assert class_weights([1, 1, 1], 2).tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="at least one"):
        class_weights([], 2)


def test_weighted_cross_entropy_by_hand():
    from otfed.models.training import cross_entropy

    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.0], [0.0, 3.0, 1.0], [1.0, 1.0, 1.0]])
    targets = torch.tensor([0, 1, 1, 2])
    w = torch.tensor([1.5, 0.75, 3.0])
    nll = [-(z[y] - np.log(np.exp(z).sum())) for z, y in zip(logits.double().numpy(), targets.tolist())]
    by_hand = (1.5 * nll[0] + 0.75 * nll[1] + 0.75 * nll[2] + 3.0 * nll[3]) / 4  # divided by |B|, not Σw
    assert float(cross_entropy(logits, targets, w)) == pytest.approx(by_hand, rel=1e-6)
    assert float(cross_entropy(logits, targets)) == pytest.approx(np.mean(nll), rel=1e-6)


def test_class_balanced_training_minimises_the_weighted_loss(task, tiny_spec):
    """One full-batch epoch without dropout: the epoch's loss is the class-weighted cross-entropy of the initial
    model, recomputed by hand from its logits (labels made imbalanced: 3 of every 4 positives dropped)."""
    from otfed.models.training import class_weights

    tr, ytr, va, yva = task
    keep = [i for i, y in enumerate(ytr) if y == 0 or i % 4 == 0]
    tr, ytr = [tr[i] for i in keep], np.array([ytr[i] for i in keep])
    spec = tiny_spec.model_copy(update=dict(dropout=0.0))
    clf = build_classifier(spec, LABELS, tr, seed=0)
    with torch.no_grad():
        logits = clf.logits(clf.encode(tr)).double().numpy()
    nll = -(logits[np.arange(len(tr)), ytr] - np.log(np.exp(logits).sum(axis=1)))
    w = class_weights(ytr, 2)
    assert w[1] > 1.5 > w[0]
    for balanced, expected in [(True, np.mean(w[ytr] * nll)), (False, np.mean(nll))]:
        clf = build_classifier(spec, LABELS, tr, seed=0)
        result = train_classifier(clf, tr, ytr, va, yva, TrainingConfig(epochs=1, batch_size=len(tr), patience=None,
                                                                        class_balanced=balanced), progress=False)
        assert result.history[0]["train_loss"] == pytest.approx(expected, rel=1e-5)


# ----------------------------------------------------------------------------------- epoch selection
@pytest.mark.slow  # trains two models for several epochs
def test_select_last_keeps_the_last_epoch_and_needs_no_validation(task, tiny_spec):
    tr, ytr, va, yva = task
    clf = build_classifier(tiny_spec, LABELS, tr, seed=0)
    snapshots = {}
    result = train_classifier(clf, tr, ytr, va, yva, fast(epochs=6, patience=None, select="last"), seed=0,
                              on_epoch=lambda r: snapshots.__setitem__(r["epoch"], weights(clf)), progress=False)
    assert result.epochs_run == 6 and result.best_epoch == 6
    assert result.best_score == result.history[-1]["val_macro_f1"]
    assert equal(weights(clf), snapshots[6])
    assert macro_f1(yva, predict_labels(clf, va), n_labels=2) == result.best_score
    # the same run, choosing on validation, restores the first perfect epoch instead (not the last one)
    again = build_classifier(tiny_spec, LABELS, tr, seed=0)
    best = train_classifier(again, tr, ytr, va, yva, fast(epochs=6, patience=None), seed=0, progress=False)
    assert [r["train_loss"] for r in best.history] == [r["train_loss"] for r in result.history]
    first_best = int(np.argmax([r["val_macro_f1"] for r in result.history])) + 1
    assert best.best_epoch == first_best and best.epochs_run == 6
    assert equal(weights(again), snapshots[first_best])
    # no validation texts: scored NaN, still trained
    empty = build_classifier(tiny_spec, LABELS, tr, seed=0)
    blind = train_classifier(empty, tr, ytr, [], [], fast(epochs=2, patience=None, select="last"), progress=False)
    assert blind.epochs_run == 2 and np.isnan(blind.best_score)
    assert all(np.isnan(r["val_macro_f1"]) and np.isnan(r["val_accuracy"]) for r in blind.history)


def test_training_config_rejects_early_stopping_with_select_last():
    from otfed.errors import ConfigError

    with pytest.raises(ConfigError, match="patience must be null when select is 'last'"):
        TrainingConfig(select="last")
    with pytest.raises(ConfigError, match="select"):
        TrainingConfig(select="first", patience=None)
    assert TrainingConfig().select == "best_val" and TrainingConfig().class_balanced is False


@pytest.mark.slow  # trains a model for several epochs
def test_select_best_val_loss_keeps_the_epoch_of_the_lowest_validation_cross_entropy(task, tiny_spec):
    """The recorded val_loss is the (label-balanced) cross-entropy of the epoch's predictions, recomputed here
    with numpy; the kept weights are the epoch with the lowest one, and training stops ``patience`` epochs after it."""
    from otfed.models.training import class_weights

    tr, ytr, va, yva = task
    yva = np.asarray(yva)
    for balanced in (False, True):
        clf = build_classifier(tiny_spec, LABELS, tr, seed=0)
        snapshots, losses = {}, {}

        def keep(record):
            snapshots[record["epoch"]] = weights(clf)
            p = clf.predict_proba(va)
            nll = -np.log(p[np.arange(len(yva)), yva])
            w = class_weights(yva, 2)[yva] if balanced else np.ones(len(yva))
            losses[record["epoch"]] = float((w * nll).sum() / w.sum())
            assert record["val_loss"] == pytest.approx(losses[record["epoch"]], rel=1e-6)

        result = train_classifier(clf, tr, ytr, va, yva, fast(epochs=40, patience=2, select="best_val_loss",
                                                               class_balanced=balanced),
                                  seed=0, on_epoch=keep, progress=False)
        best = min(losses, key=losses.get)
        assert result.best_epoch == best
        assert result.epochs_run == min(40, best + 2)
        assert equal(weights(clf), snapshots[best])
        assert result.best_score == result.history[best - 1]["val_macro_f1"]
