"""KNOT's protocol: typed messages, the server's teacher ensemble built from messages only, and their files."""
from __future__ import annotations

import numpy as np
import pytest

from otfed.errors import DataFileError
from otfed.federation.knot import (BIAS, SOFT_BIAS, TeacherEnsemble, bias_message, client_messages, load_messages,
                                   save_messages, server_ensemble, soft_bias_message, teacher_ensemble)
from otfed.federation.ledger import Channel
from otfed.federation.messages import SERVER, CountMessage, HistogramMessage, PredictionMessage


def _probs(rng: np.random.Generator, n: int = 7, c: int = 5) -> np.ndarray:
    return rng.dirichlet(np.ones(c), size=n)


def test_ensemble_stacks_predictions_in_the_requested_order() -> None:
    rng = np.random.default_rng(0)
    p1, p2 = _probs(rng), _probs(rng)
    msgs = [*client_messages("a", p1, 10), *client_messages("b", p2, 30),
            bias_message("b", np.array([0, 0, 1.0, 0, 0])), bias_message("a", np.full(5, 0.2))]
    ens = teacher_ensemble(msgs, order=["b", "a"])
    assert ens.names == ("b", "a")
    np.testing.assert_array_equal(ens.probabilities[:, 0], p2)
    np.testing.assert_array_equal(ens.probabilities[:, 1], p1)
    np.testing.assert_array_equal(ens.dataset_sizes, [30, 10])
    np.testing.assert_array_equal(ens.biases, [[0, 0, 1, 0, 0], [0.2] * 5])
    sub = ens.subset(["a"])
    np.testing.assert_array_equal(sub.probabilities[:, 0], p1)
    assert sub.biases.shape == (1, 5)


def test_server_ensemble_is_the_locals_then_the_global_model() -> None:
    """Learning without forgetting (KNOT §6): the frozen global model is the last teacher; without it only
    the locals count. A message from a party that is no teacher is ignored."""
    rng = np.random.default_rng(4)
    probs = {name: _probs(rng) for name in ("a", "b", "g", "stranger")}
    sizes = {"a": 10, "b": 20, "g": 30, "stranger": 40}
    msgs = [m for name, p in probs.items() for m in client_messages(name, p, sizes[name])]
    with_global = server_ensemble(msgs, ["b", "a"], "g")
    assert with_global.names == ("b", "a", "g")
    np.testing.assert_array_equal(with_global.probabilities, np.stack([probs["b"], probs["a"], probs["g"]], axis=1))
    np.testing.assert_array_equal(with_global.dataset_sizes, [20, 10, 30])
    locals_only = server_ensemble(msgs, ["a", "b"])
    assert locals_only.names == ("a", "b")
    np.testing.assert_array_equal(locals_only.probabilities[:, 1], probs["b"])
    with pytest.raises(ValueError, match="no transfer-set predictions received from 'c'"):
        server_ensemble(msgs, ["a", "c"], "g")


def test_missing_or_inconsistent_messages_name_the_sender() -> None:
    rng = np.random.default_rng(1)
    with pytest.raises(ValueError, match="dataset size received from 'a'"):
        teacher_ensemble([PredictionMessage(kind="transfer_predictions", sender="a", receiver=SERVER,
                                            probabilities=_probs(rng))])
    with pytest.raises(ValueError, match="different shapes"):
        teacher_ensemble([*client_messages("a", _probs(rng, n=7), 1), *client_messages("b", _probs(rng, n=8), 1)])
    with pytest.raises(ValueError, match="no probability bias received from \\['b'\\]"):
        teacher_ensemble([*client_messages("a", _probs(rng), 1), *client_messages("b", _probs(rng), 1),
                          bias_message("a", np.full(5, 0.2))])
    with pytest.raises(ValueError, match="predictions must be"):
        PredictionMessage(kind="x", sender="a", receiver=SERVER, probabilities=np.ones((3, 2)))


def test_messages_round_trip_through_their_file(tmp_path) -> None:
    rng = np.random.default_rng(2)
    msgs = [*client_messages("a", _probs(rng), 12), bias_message("a", np.array([0.5, 0.5, 0, 0, 0]))]
    save_messages(tmp_path / "m.npz", msgs)
    back = load_messages(tmp_path / "m.npz")
    assert [type(m) for m in back] == [type(m) for m in msgs]
    assert [(m.kind, m.sender, m.receiver) for m in back] == [(m.kind, m.sender, m.receiver) for m in msgs]
    np.testing.assert_array_equal(back[0].probabilities, msgs[0].probabilities)
    assert isinstance(back[1], CountMessage) and back[1].value == 12
    with pytest.raises(DataFileError, match="m2.npz: message file not found"):
        load_messages(tmp_path / "m2.npz")


def test_ledger_records_only_prediction_sized_payloads() -> None:
    """Privacy (KNOT §3): what reaches the server is N×C predictions, one count and one C-histogram per
    client — the byte count is exactly that, so no text, label or weight can ride along."""
    rng = np.random.default_rng(3)
    channel = Channel(keep_inbox=True)
    for name in ("a", "b"):
        for m in [*client_messages(name, _probs(rng, n=11), 5), bias_message(name, np.full(5, 0.2))]:
            channel.send(m)
    inbox = channel.received_by(SERVER)
    assert channel.ledger.total_bytes == 2 * (11 * 5 * 8 + 8 + 5 * 8)
    assert {type(m).__name__ for m in inbox} == {"PredictionMessage", "CountMessage", "HistogramMessage"}
    assert isinstance(teacher_ensemble(inbox), TeacherEnsemble)


# ------------------------------------------------------------ the soft bias (ablation), beside the papers' B_k
def _with_both_biases(rng: np.random.Generator, names=("a", "b", "g")) -> tuple[list, dict, dict]:
    hard = {n: np.eye(5)[i] for i, n in enumerate(names)}
    soft = {n: rng.dirichlet(np.ones(5)) for n in names}
    msgs = [m for n in names
            for m in (*client_messages(n, _probs(rng), 10), bias_message(n, hard[n]), soft_bias_message(n, soft[n]))]
    return msgs, hard, soft


def test_both_bias_kinds_round_trip_through_one_file(tmp_path) -> None:
    rng = np.random.default_rng(5)
    msgs, hard, soft = _with_both_biases(rng, names=("a", "b"))
    save_messages(tmp_path / "bias.npz", [m for m in msgs if isinstance(m, HistogramMessage)])
    back = load_messages(tmp_path / "bias.npz")
    assert [(m.kind, m.sender) for m in back] == [(BIAS, "a"), (SOFT_BIAS, "a"), (BIAS, "b"), (SOFT_BIAS, "b")]
    assert SOFT_BIAS == "probability_bias_soft" != BIAS
    for m in back:
        assert isinstance(m, HistogramMessage) and m.receiver == SERVER
        np.testing.assert_array_equal(m.histogram, (hard if m.kind == BIAS else soft)[m.sender])


def test_bias_kind_picks_which_histograms_fill_the_ensemble() -> None:
    """Default: the papers' B_k (argmax frequencies) even when soft biases arrived too; ``SOFT_BIAS``: the
    ablation's mean probability rows, in teacher order; anything else is refused by name."""
    rng = np.random.default_rng(6)
    msgs, hard, soft = _with_both_biases(rng)
    order = ["b", "a", "g"]
    np.testing.assert_array_equal(server_ensemble(msgs, ["b", "a"], "g").biases, [hard[n] for n in order])
    np.testing.assert_array_equal(server_ensemble(msgs, ["b", "a"], "g", bias_kind=BIAS).biases,
                                  [hard[n] for n in order])
    picked = server_ensemble(msgs, ["b", "a"], "g", bias_kind=SOFT_BIAS)
    np.testing.assert_array_equal(picked.biases, [soft[n] for n in order])
    np.testing.assert_array_equal(picked.probabilities, server_ensemble(msgs, ["b", "a"], "g").probabilities)
    np.testing.assert_array_equal(teacher_ensemble(msgs, bias_kind=SOFT_BIAS).biases, [soft[n] for n in "abg"])
    for call in (lambda: server_ensemble(msgs, ["a"], bias_kind="argmax"),
                 lambda: teacher_ensemble(msgs, bias_kind="soft")):
        with pytest.raises(ValueError, match=r"bias_kind must be one of \['probability_bias', "
                                             r"'probability_bias_soft'\], got '(argmax|soft)'"):
            call()


def test_a_missing_soft_bias_is_named_only_when_the_soft_kind_is_asked_for() -> None:
    rng = np.random.default_rng(7)
    msgs, hard, _ = _with_both_biases(rng, names=("a", "b"))
    without_b = [m for m in msgs if not (m.kind == SOFT_BIAS and m.sender == "b")]
    np.testing.assert_array_equal(server_ensemble(without_b, ["a", "b"]).biases, [hard["a"], hard["b"]])
    with pytest.raises(ValueError, match=r"no probability bias received from \['b'\] \(kind 'probability_bias_soft'\)"):
        server_ensemble(without_b, ["a", "b"], bias_kind=SOFT_BIAS)
    only_soft = [m for m in msgs if m.kind != BIAS]
    assert server_ensemble(only_soft, ["a", "b"]).biases is None  # no B_k sent: the hard ensemble has none
