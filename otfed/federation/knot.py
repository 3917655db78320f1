"""KNOT's federated protocol (KNOT §3): what crosses the client/server boundary.

A KNOT client trains its teacher on private data and sends the server three things, each a typed
message recorded in the ledger:

- its teacher's predictions h_k(x) on the shared, unlabelled transfer set (:class:`PredictionMessage`),
- its local dataset size n_k, used only by the "D" weighting (:class:`CountMessage`),
- its teacher's probability bias B_k, used only by the "E" weighting (:class:`HistogramMessage`) — the
  papers' argmax frequencies (kind ``BIAS``) and, for the ablation, the soft bias, its mean probability row
  on the same random texts (kind ``SOFT_BIAS``); the server uses one of the two (``bias_kind``).

The server never receives client texts, labels or model weights. :func:`teacher_ensemble` is the only
way the server-side distillation code gets teacher information: it builds a :class:`TeacherEnsemble`
from received messages alone (:func:`server_ensemble`: the teachers of a KNOT run, in order). Messages
persist between stages in one ``.npz`` file per task
(:func:`save_messages` / :func:`load_messages`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from otfed import io
from otfed.distill.ensemble import TeacherEnsemble
from otfed.errors import DataFileError
from otfed.federation.messages import SERVER, CountMessage, HistogramMessage, Message, PredictionMessage

PREDICTIONS = "transfer_predictions"
DATASET_SIZE = "dataset_size"
BIAS = "probability_bias"
SOFT_BIAS = "probability_bias_soft"
#: The histogram kinds that can fill :attr:`TeacherEnsemble.biases`.
BIAS_KINDS = (BIAS, SOFT_BIAS)


def client_messages(party: str, transfer_probabilities: np.ndarray, n_train: int) -> list[Message]:
    """A KNOT client's messages after local training: transfer-set predictions and dataset size."""
    return [
        PredictionMessage(kind=PREDICTIONS, sender=party, receiver=SERVER, probabilities=transfer_probabilities),
        CountMessage(kind=DATASET_SIZE, sender=party, receiver=SERVER, value=int(n_train)),
    ]


def bias_message(party: str, bias: np.ndarray) -> HistogramMessage:
    """A KNOT client's probability bias B_k (KNOT app. D.1), sent for the "E" weighting."""
    return HistogramMessage(kind=BIAS, sender=party, receiver=SERVER, histogram=np.asarray(bias, dtype=np.float64))


def soft_bias_message(party: str, bias: np.ndarray) -> HistogramMessage:
    """A KNOT client's soft probability bias — its teacher's mean probability row on the random texts of
    app. D.1 (an ablation of B_k, not the papers' definition) — sent for the "E" weighting's ablation."""
    return HistogramMessage(kind=SOFT_BIAS, sender=party, receiver=SERVER,
                            histogram=np.asarray(bias, dtype=np.float64))


def _check_bias_kind(bias_kind: str) -> None:
    if bias_kind not in BIAS_KINDS:
        raise ValueError(f"bias_kind must be one of {list(BIAS_KINDS)}, got {bias_kind!r}")


def teacher_ensemble(messages: Iterable[Message], order: Sequence[str] | None = None, *,
                     bias_kind: str = BIAS) -> TeacherEnsemble:
    """The server's view of the teachers, assembled from received messages (KNOT §3).

    Every sender needs one prediction message and one dataset-size message; bias messages are optional
    but, if any sender sent one of kind ``bias_kind``, all must have. ``bias_kind`` picks the histograms that
    become :attr:`TeacherEnsemble.biases`: ``BIAS``, the papers' argmax frequencies B_k (KNOT §5.2), or
    ``SOFT_BIAS``, the ablation's mean probability rows; bias messages of the other kind are ignored.
    ``order`` fixes the teacher order (default: order of first prediction message). Raises ValueError
    naming the sender on a missing or inconsistent message, and on a ``bias_kind`` outside those two.

    Parameters:
        messages: the messages the server received (:func:`client_messages`, :func:`bias_message`,
            :func:`soft_bias_message`), each addressed to the server.
        order: the teachers' names in the order wanted; default the order of their first prediction message.
        bias_kind: ``BIAS`` (the papers' B_k) or ``SOFT_BIAS`` (the ablation).

    Returns:
        A :class:`TeacherEnsemble`: ``names``, ``probabilities`` N×K×C, ``dataset_sizes`` K and ``biases`` K×C
        (None when no bias message of ``bias_kind`` came).

    Two clients' messages, stacked in the order asked for — exactly what the clients sent, nothing more:

    >>> alice, bob = np.full((4, 3), 1 / 3), np.eye(3)[[0, 1, 2, 0]]
    >>> messages = [*client_messages("alice", alice, 120), *client_messages("bob", bob, 40),
    ...             bias_message("alice", [1.0, 0.0, 0.0]), bias_message("bob", [0.0, 0.0, 1.0])]
    >>> ensemble = teacher_ensemble(messages, order=["bob", "alice"])
    >>> ensemble.names, ensemble.probabilities.shape, ensemble.dataset_sizes.tolist()
    (('bob', 'alice'), (4, 2, 3), [40, 120])
    >>> bool(np.array_equal(ensemble.probabilities[:, 1], alice)), ensemble.biases.tolist()
    (True, [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    """
    _check_bias_kind(bias_kind)
    preds: dict[str, np.ndarray] = {}
    sizes: dict[str, int] = {}
    biases: dict[str, np.ndarray] = {}
    for m in messages:
        if m.receiver != SERVER:
            raise ValueError(f"message {m.kind!r} from {m.sender!r} is addressed to {m.receiver!r}, not the server")
        if isinstance(m, PredictionMessage):
            preds[m.sender] = m.probabilities
        elif isinstance(m, CountMessage) and m.kind == DATASET_SIZE:
            sizes[m.sender] = m.value
        elif isinstance(m, HistogramMessage) and m.kind in BIAS_KINDS:
            if m.kind == bias_kind:
                biases[m.sender] = m.histogram
        else:
            raise ValueError(f"unexpected message {type(m).__name__} {m.kind!r} from {m.sender!r}")
    names = tuple(order) if order is not None else tuple(preds)
    if not names:
        raise ValueError("no teacher predictions received")
    for name in names:
        if name not in preds:
            raise ValueError(f"no transfer-set predictions received from {name!r}")
        if name not in sizes:
            raise ValueError(f"no dataset size received from {name!r}")
    shapes = {preds[n].shape for n in names}
    if len(shapes) != 1:
        raise ValueError(f"teachers sent predictions of different shapes: {sorted(shapes)}")
    if biases and set(names) - set(biases):
        raise ValueError(f"no probability bias received from {sorted(set(names) - set(biases))} "
                         f"(kind {bias_kind!r})")
    return TeacherEnsemble(
        names=names,
        probabilities=np.stack([preds[n] for n in names], axis=1),
        dataset_sizes=np.asarray([sizes[n] for n in names], dtype=np.int64),
        biases=np.stack([biases[n] for n in names]) if biases else None,
    )


def server_ensemble(messages: Iterable[Message], locals: Sequence[str], global_party: str | None = None, *,
                    bias_kind: str = BIAS) -> TeacherEnsemble:
    """The KNOT server's teacher ensemble from the messages it received (KNOT §3): the local teachers in
    ``locals`` order, then — under learning without forgetting (KNOT §6) — the frozen global model
    ``global_party`` as one more teacher (None: locals only). Messages from anyone else are ignored.
    ``bias_kind`` (``BIAS`` or ``SOFT_BIAS``) picks the bias histograms, as in :func:`teacher_ensemble`."""
    _check_bias_kind(bias_kind)
    order = [*locals, *([] if global_party is None else [global_party])]
    return teacher_ensemble([m for m in messages if m.sender in order], order=order, bias_kind=bias_kind)


def save_messages(path: str | Path, messages: Sequence[Message]) -> None:
    """Write messages to one ``.npz`` (atomic): sender, receiver, kind, type and payload of each."""
    arrays: dict[str, np.ndarray] = {}
    meta = []
    for i, m in enumerate(messages):
        if isinstance(m, PredictionMessage):
            arrays[f"payload_{i}"] = m.probabilities
        elif isinstance(m, HistogramMessage):
            arrays[f"payload_{i}"] = m.histogram
        elif isinstance(m, CountMessage):
            arrays[f"payload_{i}"] = np.asarray([m.value], dtype=np.int64)
        else:
            raise ValueError(f"cannot store message type {type(m).__name__}")
        meta.append((type(m).__name__, m.kind, m.sender, m.receiver))
    arrays["meta"] = np.asarray(meta, dtype=str).reshape(len(meta), 4)
    io.write_npz(path, **arrays)


_TYPES = {"PredictionMessage": (PredictionMessage, "probabilities"),
          "HistogramMessage": (HistogramMessage, "histogram"),
          "CountMessage": (CountMessage, "value")}


def load_messages(path: str | Path) -> list[Message]:
    """Read messages written by :func:`save_messages` (DataFileError naming the file if unreadable)."""
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{path}: message file not found (run the stage that writes it first)")
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = data["meta"]
            out: list[Message] = []
            for i, (type_name, kind, sender, receiver) in enumerate(meta):
                cls, field = _TYPES[str(type_name)]
                payload = data[f"payload_{i}"]
                value = int(payload[0]) if cls is CountMessage else payload
                out.append(cls(kind=str(kind), sender=str(sender), receiver=str(receiver), **{field: value}))
    except (KeyError, ValueError, OSError) as exc:
        raise DataFileError(f"{path}: not a valid message file ({exc})") from None
    return out
