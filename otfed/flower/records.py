"""otfed's typed messages on the wire, and the check every received message passes before it is used.

A message crosses a Flower transport as a :class:`WireMessage`: its metadata (``kind``, ``sender``,
``receiver``, ``payload`` and, for a distance, its ``value``) and its arrays, each a :class:`WireArray` — a
declared dtype, a declared shape and the raw little-endian bytes. That is exactly what a Flower ``ConfigRecord``
and an ``Array`` of an ``ArrayRecord`` hold (:mod:`otfed.flower.transport` maps one onto the other), so this
module needs no ``flwr`` and its checks run, and are tested, in any environment.

A received message is untrusted input. :func:`message_from_wire` decodes one only after
:func:`refusal` found nothing wrong with it against an :class:`Expected` derived from the session's config
(S, d): the declared kind and payload, no field beyond the declared ones, the dtype, the shape, the size in
bytes (checked first, before any decoding) and finiteness; a measure's weights must also be a probability
vector. What is wrong is raised as one :class:`MessageRefused` line naming the node.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from otfed.federation.messages import DistanceMessage, MeasureMessage, Message, MomentMessage
from otfed.ot import Measure

#: the one dtype arrays travel in (otfed's messages are float64 throughout)
WIRE_DTYPE = "<f8"
#: metadata every message carries
META_FIELDS = ("kind", "sender", "receiver", "payload")
#: tolerance on Σ weights = 1 for a received measure
WEIGHT_SUM_TOL = 1e-9


class MessageRefused(ValueError):
    """A received message failed its check: one line naming the node and what was wrong."""


@dataclass(frozen=True)
class WireArray:
    """One array as it travels: declared dtype and shape, and its raw bytes (C order)."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes

    @classmethod
    def of(cls, array: np.ndarray) -> "WireArray":
        a = np.ascontiguousarray(np.asarray(array, dtype=WIRE_DTYPE))
        return cls(WIRE_DTYPE, tuple(int(s) for s in a.shape), a.tobytes())


@dataclass(frozen=True)
class WireMessage:
    """One message as it travels: its metadata (strings and numbers) and its arrays by field name."""

    meta: Mapping[str, str | float | int]
    arrays: Mapping[str, WireArray] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of array payload (what the ledger counts for the same message)."""
        return sum(len(a.data) for a in self.arrays.values())


@dataclass(frozen=True)
class Expected:
    """What a received message must be.

    ``payload``: ``"measure"``, ``"distance"`` or ``"moments"``; ``kind``: the protocol step (``"gamma"``,
    ``"eta_Q"``, ``"client_distance"``, …); ``sender``: the party it must come from (None: not checked);
    ``atoms``: the exact number of atoms of a measure, or ``max_atoms`` an upper bound on it (exact
    interpolation grows supports up to ``max_support``); ``dim``: the dimension d of a measure or of moments.
    """

    payload: str
    kind: str
    sender: str | None = None
    atoms: int | None = None
    max_atoms: int | None = None
    dim: int | None = None

    def array_shapes(self) -> dict[str, tuple[int | None, ...]]:
        """The declared arrays and their shapes (None: any size up to the bound)."""
        if self.payload == "measure":
            n = self.atoms
            return {"support": (n, self.dim), "weights": (n,)}
        if self.payload == "moments":
            return {"mean": (self.dim,), "covariance": (self.dim, self.dim)}
        return {}

    def max_bytes(self) -> int:
        """The size bound: the bytes of the largest message this step may send (8 bytes per float64)."""
        if self.payload == "measure":
            n = self.atoms if self.atoms is not None else self.max_atoms
            return 8 * int(n) * (int(self.dim) + 1)  # type: ignore[arg-type]
        if self.payload == "moments":
            return 8 * int(self.dim) * (int(self.dim) + 1)  # type: ignore[arg-type]
        return 0

    def meta_fields(self) -> tuple[str, ...]:
        return META_FIELDS + (("value",) if self.payload == "distance" else ())


def message_to_wire(message: Message) -> WireMessage:
    """A :class:`MeasureMessage`, :class:`DistanceMessage` or :class:`MomentMessage` as it travels."""
    meta: dict[str, str | float | int] = {"kind": message.kind, "sender": message.sender,
                                           "receiver": message.receiver, "payload": message.payload_type}
    if isinstance(message, MeasureMessage):
        arrays = {"support": WireArray.of(message.measure.support), "weights": WireArray.of(message.measure.weights)}
    elif isinstance(message, DistanceMessage):
        meta["value"] = float(message.value)
        arrays = {}
    elif isinstance(message, MomentMessage):
        arrays = {"mean": WireArray.of(message.mean), "covariance": WireArray.of(message.covariance)}
    else:
        raise TypeError(f"no wire form for {type(message).__name__} (payload {message.payload_type!r})")
    return WireMessage(meta, arrays)


def refusal(wire: WireMessage, expected: Expected) -> str | None:
    """What is wrong with ``wire`` as the message ``expected`` describes (None: nothing).

    Checked in this order, so that nothing is decoded before its size is known to be within the bound: the
    payload, kind and sender, then the metadata fields (no missing, no unexpected one); the array fields; the total size
    against :meth:`Expected.max_bytes`; each array's declared dtype, shape and byte length; then the values:
    finite, and for a measure non-negative weights summing to 1, for a distance a finite value ≥ 0.
    """
    for key in META_FIELDS:
        if key not in wire.meta:
            return f"missing field {key!r} in a {expected.kind!r} message"
        if not isinstance(wire.meta[key], str):
            return f"field {key!r} must be a string, got {type(wire.meta[key]).__name__}"
    if wire.meta["payload"] != expected.payload:
        return f"payload {wire.meta['payload']!r} where a {expected.payload!r} was expected"
    if wire.meta["kind"] != expected.kind:
        return f"kind {wire.meta['kind']!r} where {expected.kind!r} was expected"
    if expected.sender is not None and wire.meta["sender"] != expected.sender:
        return f"sender {wire.meta['sender']!r} where {expected.sender!r} was expected"
    want_meta = set(expected.meta_fields())
    got_meta = set(wire.meta)
    if got_meta - want_meta:
        return f"unexpected field(s) {sorted(got_meta - want_meta)} in a {expected.kind!r} message"
    if want_meta - got_meta:
        return f"missing field(s) {sorted(want_meta - got_meta)} in a {expected.kind!r} message"
    shapes = expected.array_shapes()
    if set(wire.arrays) != set(shapes):
        extra, missing = sorted(set(wire.arrays) - set(shapes)), sorted(set(shapes) - set(wire.arrays))
        return (f"{expected.kind!r}: unexpected array(s) {extra}" if extra
                else f"{expected.kind!r}: missing array(s) {missing}")
    size, bound = wire.nbytes, expected.max_bytes()
    if size > bound:
        return f"{expected.kind!r} is {size} bytes, over the session's bound of {bound} bytes"
    arrays: dict[str, np.ndarray] = {}
    for name, want in shapes.items():
        a = wire.arrays[name]
        if a.dtype != WIRE_DTYPE:
            return f"{expected.kind!r}.{name} has dtype {a.dtype!r}, expected {WIRE_DTYPE!r} (float64)"
        if len(a.shape) != len(want) or any(w is not None and s != w for s, w in zip(a.shape, want)) \
                or any(s < 0 for s in a.shape):
            return f"{expected.kind!r}.{name} has shape {tuple(a.shape)}, expected {_shape_text(want)}"
        if len(a.data) != 8 * int(np.prod(a.shape, dtype=np.int64)):
            return f"{expected.kind!r}.{name} holds {len(a.data)} bytes for its declared shape {tuple(a.shape)}"
        arrays[name] = np.frombuffer(a.data, dtype=WIRE_DTYPE).reshape(a.shape)
        if not np.isfinite(arrays[name]).all():
            return f"{expected.kind!r}.{name} contains NaN or inf"
    if expected.payload == "measure":
        n = arrays["support"].shape[0]
        if arrays["weights"].shape != (n,):
            return f"{expected.kind!r}: {n} atoms but {arrays['weights'].shape[0]} weights"
        if n == 0:
            return f"{expected.kind!r}: a measure with no atoms"
        if expected.max_atoms is not None and n > expected.max_atoms:
            return f"{expected.kind!r} has {n} atoms, over the session's bound of {expected.max_atoms}"
        w = arrays["weights"]
        if (w < 0).any() or abs(float(w.sum()) - 1.0) > WEIGHT_SUM_TOL:
            return f"{expected.kind!r}: weights are not a probability vector (sum {float(w.sum())!r})"
    if expected.payload == "distance":
        value = wire.meta["value"]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{expected.kind!r}: value must be a number, got {type(value).__name__}"
        if not np.isfinite(value) or value < 0:
            return f"{expected.kind!r}: value {value!r} is not a finite distance ≥ 0"
    return None


def _shape_text(shape: Sequence[int | None]) -> str:
    return "(" + ", ".join("n" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def message_from_wire(wire: WireMessage, expected: Expected, node: str) -> Message:
    """The typed message ``wire`` carries, once :func:`refusal` found nothing wrong with it; otherwise
    :class:`MessageRefused` — ``"<node>: <what was wrong>"``."""
    problem = refusal(wire, expected)
    if problem is not None:
        raise MessageRefused(f"{node}: refused a message: {problem}")
    meta = wire.meta
    head = (str(meta["kind"]), str(meta["sender"]), str(meta["receiver"]))

    def array(name: str) -> np.ndarray:
        a = wire.arrays[name]
        return np.frombuffer(a.data, dtype=WIRE_DTYPE).reshape(a.shape).copy()

    if expected.payload == "measure":
        return MeasureMessage(*head, measure=Measure(array("support"), array("weights")))
    if expected.payload == "distance":
        return DistanceMessage(*head, value=float(meta["value"]))
    return MomentMessage(*head, mean=array("mean"), covariance=array("covariance"))


def measure_atoms(support_size: int, interpolation: str, max_support: int | None) -> tuple[int | None, int | None]:
    """(``atoms``, ``max_atoms``) of every measure a FedBary / FedWaD session sends: exactly S with approximate
    interpolation (FedWaD eq. 10: every interpolant lives on the S atoms of ξ or γ); with exact interpolation
    (eq. 5) supports grow, up to ``max_support``, which a session over a network must therefore set."""
    if interpolation == "approx":
        return support_size, None
    if max_support is None:
        raise ValueError("exact interpolation grows every measure's support: set max_support to bound the "
                         "messages of a session over a network")
    return None, max_support


@dataclass(frozen=True)
class Packet:
    """Everything one Flower message carries: a ``head`` of plain values (the method called, the session's
    settings, a reply's scalars), otfed's typed messages in order, and loose arrays (e.g. a client's datum
    values). :mod:`otfed.flower.transport` maps it onto a Flower ``RecordDict`` — one ``ConfigRecord`` for the
    head, one ``ConfigRecord`` + ``ArrayRecord`` per typed message, one ``ArrayRecord`` for the loose arrays."""

    head: Mapping[str, str | float | int | bool] = field(default_factory=dict)
    messages: Sequence[WireMessage] = ()
    arrays: Mapping[str, WireArray] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of array payload in the packet."""
        return sum(m.nbytes for m in self.messages) + sum(len(a.data) for a in self.arrays.values())


def head_refusal(head: Mapping[str, object], expected: Mapping[str, type | tuple[type, ...]]) -> str | None:
    """What is wrong with a packet's ``head`` against ``expected`` (field → type(s)): a missing or unexpected
    field, or a value of another type (a bool is not a number). None: nothing."""
    extra, missing = sorted(set(head) - set(expected)), sorted(set(expected) - set(head))
    if extra:
        return f"unexpected field(s) {extra}"
    if missing:
        return f"missing field(s) {missing}"
    for key, kinds in expected.items():
        value = head[key]
        number = kinds in (int, float) or (isinstance(kinds, tuple) and (int in kinds or float in kinds))
        if not isinstance(value, kinds) or (number and isinstance(value, bool) and kinds is not bool):
            return f"field {key!r} is a {type(value).__name__}"
        if isinstance(value, float) and not np.isfinite(value):
            return f"field {key!r} is {value!r}"
    return None


def loose_array(packet: Packet, name: str, shape: tuple[int, ...], node: str) -> np.ndarray:
    """The loose array ``name`` of ``packet`` once it is exactly float64 of ``shape``, finite, and the packet
    holds no other loose array; otherwise :class:`MessageRefused` naming ``node``."""
    if set(packet.arrays) != {name}:
        raise MessageRefused(f"{node}: refused a message: arrays {sorted(packet.arrays)} where only {name!r} was "
                             "expected")
    a = packet.arrays[name]
    if len(a.data) > 8 * int(np.prod(shape, dtype=np.int64)):
        raise MessageRefused(f"{node}: refused a message: {name!r} is {len(a.data)} bytes, over the bound of "
                             f"{8 * int(np.prod(shape))} bytes")
    if a.dtype != WIRE_DTYPE or tuple(a.shape) != tuple(shape) or len(a.data) != 8 * int(np.prod(shape)):
        raise MessageRefused(f"{node}: refused a message: {name!r} is {a.dtype} of shape {tuple(a.shape)}, "
                             f"expected float64 of shape {tuple(shape)}")
    values = np.frombuffer(a.data, dtype=WIRE_DTYPE).reshape(shape).copy()
    if not np.isfinite(values).all():
        raise MessageRefused(f"{node}: refused a message: {name!r} contains NaN or inf")
    return values
