"""Masked-language-model pretraining of a shared encoder, offline (BERT §3.1 masking; KNOT §6 teachers)."""
from __future__ import annotations

import pytest
import torch

from otfed.models import ModelSpec, TrainingConfig, build_classifier, train_classifier
from otfed.models.pretraining import IGNORE, MLMConfig, build_mlm_model, mask_tokens, pretrain_mlm
from otfed.models.tokenizer import train_wordpiece

LABELS = ("neg", "pos")


def test_masking_follows_berts_80_10_10_rule():
    V, mask_id = 1000, 4
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, V, (400, 250), generator=g)
    special = torch.zeros_like(ids, dtype=torch.bool)
    special[:, 0] = special[:, -1] = True
    special[:200, 150:] = True  # padding of the first half of the rows
    inputs, labels = mask_tokens(ids, special, mask_id, V, torch.Generator().manual_seed(1), mask_prob=0.15)
    chosen = labels != IGNORE
    n = int((~special).sum())
    assert not chosen[special].any()  # special tokens and padding are never predicted
    assert torch.equal(labels[chosen], ids[chosen])
    assert torch.equal(inputs[~chosen], ids[~chosen])  # only chosen positions change
    k = int(chosen.sum())
    assert abs(k / n - 0.15) < 4 * (0.15 * 0.85 / n) ** 0.5  # binomial: within 4 standard deviations
    masked = (inputs[chosen] == mask_id).float().mean().item()
    kept = (inputs[chosen] == ids[chosen]).float().mean().item()  # 10 % kept, + random draws that hit the same id
    assert abs(masked - 0.8) < 4 * (0.8 * 0.2 / k) ** 0.5
    assert abs(kept - (0.1 + 0.1 / V)) < 4 * (0.1 * 0.9 / k) ** 0.5
    again = mask_tokens(ids, special, mask_id, V, torch.Generator().manual_seed(1), mask_prob=0.15)
    assert torch.equal(again[0], inputs) and torch.equal(again[1], labels)  # only the given generator is used


@pytest.fixture(scope="module")
def mlm_spec() -> ModelSpec:
    return ModelSpec(kind="bert", layers=1, hidden=32, heads=2, intermediate=64, dropout=0.1, max_length=24,
                     vocab_size=300)


def test_mlm_model_is_seeded_and_tied(task, mlm_spec):
    tokenizer = train_wordpiece(task[0], vocab_size=mlm_spec.vocab_size)
    torch.manual_seed(1)
    a = build_mlm_model(mlm_spec, tokenizer, seed=3)
    torch.manual_seed(2)
    b = build_mlm_model(mlm_spec, tokenizer, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    word = a.bert.embeddings.word_embeddings.weight
    assert a.cls.predictions.decoder.weight is word
    assert torch.all(word[tokenizer.pad_token_id] == 0)  # the padding row stays 0 (not redrawn as the decoder)
    assert torch.all(a.cls.predictions.bias == 0)
    with pytest.raises(ValueError, match="kind must be 'bert'"):
        build_mlm_model(mlm_spec.model_copy(update=dict(kind="bow")), tokenizer, seed=0)


@pytest.mark.slow  # pretrains for several epochs
def test_pretraining_lowers_the_mlm_loss_and_gives_a_checkpoint_encoder(task, mlm_spec, tmp_path):
    tr, ytr, va, yva = task
    config = MLMConfig(epochs=4, batch_size=16, lr=3e-3)
    result = pretrain_mlm(tr, mlm_spec, tmp_path / "encoder", config, seed=0, progress=False)
    losses = [r["loss"] for r in result.history]
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0]
    again = pretrain_mlm(tr, mlm_spec, tmp_path / "again", config, seed=0, progress=False)
    assert [r["loss"] for r in again.history] == losses  # same seed, same run
    spec = ModelSpec(kind="checkpoint", checkpoint=str(result.directory), max_length=24)
    clf = build_classifier(spec, LABELS, None, seed=5)
    encoder = build_mlm_model(mlm_spec, clf.tokenizer, seed=0)  # same shape, to read the saved weights into
    from safetensors.torch import load_file

    saved = load_file(str(result.directory / "model.safetensors"))
    for key, value in clf.model.state_dict().items():
        if key.startswith("bert.") and not key.startswith("bert.pooler"):
            assert torch.equal(value, saved[key]), key  # the classifier's encoder is the pretrained one
    assert set(saved) <= set(encoder.state_dict()) | {"cls.predictions.decoder.weight"}
    result_ft = train_classifier(clf, tr, ytr, va, yva, TrainingConfig(epochs=6, batch_size=16, lr=2e-3,
                                                                       patience=None), progress=False)
    assert result_ft.best_score == 1.0
    with pytest.raises(ValueError, match="needs texts"):
        pretrain_mlm([], mlm_spec, tmp_path / "none", config, progress=False)
