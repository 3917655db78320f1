"""params.yaml schema of the KNOT text track: each bad value names its key path and what is allowed."""
from __future__ import annotations

from pathlib import Path

import pytest

from stages.params import load_params, validate_params
from otfed.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def test_committed_text_params_are_valid() -> None:
    p = load_params(REPO / "params.yaml")
    assert set(p.train_teachers.tasks) <= set(p.partition.text.tasks)
    kinds = {p.train_teachers.model.kind, *(m.kind for m in p.train_teachers.party_models.values())}
    assert len(kinds) >= 2, "the default run exercises two teacher architectures"


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["partition"]["text"]["tasks"].update(pos={}), "partition.text.tasks.pos: invalid key: Input should be 'sa', 'erc' or 'nli' (got 'pos')"),
    (lambda d: d["partition"]["text"]["tasks"]["sa"].update(global_party="cell_phones"),
     "partition.text.tasks.sa: a dataset can play one role only; repeated: cell_phones"),
    (lambda d: d["train_teachers"]["model"].update(kind="gpt"), "train_teachers.model.kind: Input should be 'bert', 'distilbert', 'checkpoint' or 'bow'"),
    (lambda d: d["train_teachers"]["model"].update(kind="checkpoint"), "kind 'checkpoint' needs checkpoint"),
    (lambda d: d["train_teachers"]["model"].update(kind="bert", heads=3), "hidden (128) must be a multiple of heads (3)"),
    (lambda d: d["train_teachers"]["party_models"].update({"sa.kitchen": {"kind": "bert"}}),
     "train_teachers.party_models: unknown party 'sa.kitchen'; allowed: sa.cell_phones"),
    (lambda d: d["train_teachers"].update(party_training={"sa.kitchen": {"lr": 0.001}}),
     "train_teachers.party_training: unknown party 'sa.kitchen'; allowed: sa.cell_phones"),
    (lambda d: d["train_teachers"].update(party_training={"sa.baby": {"lr": -1}}),
     "train_teachers.party_training.sa.baby.lr: Input should be greater than 0"),
    (lambda d: d["train_teachers"]["training"].update(lr=0), "train_teachers.training.lr: Input should be greater than 0"),
    (lambda d: d["distill"].update(weightings=["A", "Z"]), "distill.weightings[1]: Input should be 'A', 'D', 'U' or 'E'"),
    (lambda d: d["distill"].update(losses=["kl", "kl"]), "distill.losses: entries must be distinct"),
    (lambda d: d["distill"].update(sinkhorn_solver="exact"),
     "distill.sinkhorn_solver: Input should be 'newton' or 'fixed' (got 'exact')"),
    (lambda d: d["distill"].update(epsilon=0.1), "distill.epsilon: unknown key; allowed keys here: batch_size, epochs, eps"),
    (lambda d: d["estimate_bias"].update(n_texts=0), "estimate_bias.n_texts: Input should be greater than or equal to 10"),
    (lambda d: d["partition"].pop("text"), "partition.text: required by the text-track stages"),
    (lambda d: d["train_teachers"].update(tasks=["sa", "erc", "nli", "pos"]), "train_teachers.tasks[3]: Input should be"),
    (lambda d: d.pop("train_teachers"), "train_teachers: required by estimate_bias and distill"),
    (lambda d: d.pop("estimate_bias"), "estimate_bias: required by distill.weightings 'E' / one_hot_ablation"),
])
def test_bad_text_params_name_the_key(config_error, mutate, expected: str) -> None:
    assert expected in config_error(mutate)


def test_task_without_partition_is_refused(raw: dict) -> None:
    data = raw
    del data["partition"]["text"]["tasks"]["nli"]
    data["train_teachers"]["party_models"] = {}
    with pytest.raises(ConfigError, match=r"train_teachers.tasks\[2\]: task 'nli' has no partition.text.tasks entry"):
        validate_params(data)


def test_distill_without_bias_weighting_needs_no_estimate_bias(raw: dict) -> None:
    data = raw
    del data["estimate_bias"]
    data["distill"].update(weightings=["A", "D", "U"], one_hot_ablation=False, soft_bias=False, mixture_weightings=["A"])
    assert validate_params(data).estimate_bias is None
    for arm in ({"soft_bias": True}, {"mixture_weightings": ["E"]}):  # E with either bias needs the biases
        with pytest.raises(ConfigError, match="estimate_bias: required by distill"):
            validate_params({**data, "distill": {**data["distill"], **arm}})
    data["distill"]["one_hot_ablation"] = True  # the ablation is a Sinkhorn-E student
    with pytest.raises(ConfigError, match="estimate_bias: required by distill.weightings 'E' / one_hot_ablation"):
        validate_params(data)
