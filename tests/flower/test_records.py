"""otfed's messages on the wire (no flwr needed): a round trip gives back the same bits, and the check of a received
message refuses each hand-built bad message — NaN, a wrong shape, an unexpected field, ten times the size bound,
another dtype, a lying byte count, weights that are no probability vector, a negative distance — with one line
naming the node, while the good message passes."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from otfed.federation.messages import DistanceMessage, MeasureMessage, MomentMessage
from otfed.flower.records import (Expected, MessageRefused, Packet, WireArray, WireMessage, head_refusal,
                                  loose_array, measure_atoms, message_from_wire, message_to_wire)
from otfed.ot import Measure

S, D = 6, 3
NODE = "node 42 (client_1)"
GAMMA = Expected("measure", "gamma", sender="client_1", atoms=S, dim=D)


def gamma(support: np.ndarray | None = None, weights: np.ndarray | None = None) -> MeasureMessage:
    rng = np.random.default_rng(0)
    support = rng.normal(size=(S, D)) if support is None else support
    weights = np.full(len(support), 1.0 / len(support)) if weights is None else weights
    return MeasureMessage("gamma", "client_1", "server", measure=Measure(support, weights))


def with_array(wire: WireMessage, name: str, array: WireArray) -> WireMessage:
    return dataclasses.replace(wire, arrays={**wire.arrays, name: array})


def refused(wire: WireMessage, expected: Expected = GAMMA) -> str:
    with pytest.raises(MessageRefused) as info:
        message_from_wire(wire, expected, NODE)
    text = str(info.value)
    assert text.startswith(f"{NODE}: refused") and "\n" not in text
    return text


def test_a_measure_travels_bit_for_bit() -> None:
    sent = gamma()
    got = message_from_wire(message_to_wire(sent), GAMMA, NODE)
    assert isinstance(got, MeasureMessage) and (got.kind, got.sender, got.receiver) == ("gamma", "client_1", "server")
    assert got.measure.support.tobytes() == sent.measure.support.tobytes()
    assert got.measure.weights.tobytes() == sent.measure.weights.tobytes()
    assert message_to_wire(sent).nbytes == sent.nbytes  # the bytes on the wire are the ledger's


def test_a_distance_and_moments_travel_exactly() -> None:
    d = DistanceMessage("client_distance", "client_1", "server", value=0.1 + 0.2)
    got = message_from_wire(message_to_wire(d), Expected("distance", "client_distance", "client_1"), NODE)
    assert got.value == 0.1 + 0.2
    rng = np.random.default_rng(1)
    a = rng.normal(size=(D, D))
    m = MomentMessage("moments", "client_1", "server", mean=rng.normal(size=D), covariance=a @ a.T)
    got = message_from_wire(message_to_wire(m), Expected("moments", "moments", dim=D), NODE)
    assert got.mean.tobytes() == m.mean.tobytes() and got.covariance.tobytes() == m.covariance.tobytes()


def test_nan_is_refused() -> None:
    support = gamma().measure.support.copy()
    support[2, 1] = np.nan  # hand-built on the wire: a client's Measure would not even hold it
    assert "'gamma'.support contains NaN or inf" in refused(
        with_array(message_to_wire(gamma()), "support", WireArray.of(support)))


def test_a_wrong_shape_is_refused() -> None:
    rng = np.random.default_rng(2)
    wire = message_to_wire(gamma())
    same_bytes = with_array(wire, "support", WireArray.of(rng.normal(size=(9, 2))))
    assert "'gamma'.support has shape (9, 2), expected (6, 3)" in refused(same_bytes)
    assert "shape (5, 3), expected (6, 3)" in refused(message_to_wire(gamma(rng.normal(size=(S - 1, D)))))
    wider = message_to_wire(gamma(rng.normal(size=(S, D + 1))))  # more bytes than the bound: refused by its size
    assert "over the session's bound" in refused(wider)


def test_an_unexpected_field_is_refused() -> None:
    wire = message_to_wire(gamma())
    extra_meta = dataclasses.replace(wire, meta={**wire.meta, "note": "hello"})
    assert "unexpected field(s) ['note']" in refused(extra_meta)
    extra_array = with_array(wire, "samples", WireArray.of(np.zeros((2, D))))
    assert "unexpected array(s) ['samples']" in refused(extra_array)


def test_ten_times_the_size_bound_is_refused_before_decoding() -> None:
    wire = message_to_wire(gamma())
    big = with_array(wire, "support", WireArray.of(np.zeros((10 * S, D))))
    text = refused(big)
    assert f"over the session's bound of {8 * S * (D + 1)} bytes" in text
    # declared small but carrying ten times the bytes: also refused by the size, not decoded
    lying = with_array(wire, "support", WireArray("<f8", (S, D), b"\0" * (80 * S * D)))
    assert "over the session's bound" in refused(lying)


def test_another_dtype_and_a_lying_byte_count_are_refused() -> None:
    wire = message_to_wire(gamma())
    as_f4 = np.zeros((S, D), dtype="<f4")
    assert "dtype '<f4'" in refused(with_array(wire, "support", WireArray("<f4", (S, D), as_f4.tobytes())))
    short = WireArray("<f8", (S, D), b"\0" * (8 * S * D - 8))
    assert "holds 136 bytes for its declared shape (6, 3)" in refused(with_array(wire, "support", short))


def test_weights_must_be_a_probability_vector() -> None:
    wire = message_to_wire(gamma())
    w = np.full(S, 1.0 / S)
    w[0] += 0.5
    assert "weights are not a probability vector" in refused(with_array(wire, "weights", WireArray.of(w)))
    w = np.full(S, 1.0 / S)
    w[:2] = [-0.1, 2.0 / S + 0.1]
    assert "weights are not a probability vector" in refused(with_array(wire, "weights", WireArray.of(w)))


def test_kind_sender_and_distance_values_are_checked() -> None:
    assert "kind 'eta_Q' where 'gamma'" in refused(message_to_wire(dataclasses.replace(gamma(), kind="eta_Q")))
    assert "sender 'client_2' where 'client_1'" in refused(
        message_to_wire(dataclasses.replace(gamma(), sender="client_2")))
    want = Expected("distance", "client_distance", "client_1")
    for value in (-1.0, np.inf, np.nan):
        wire = message_to_wire(DistanceMessage("client_distance", "client_1", "server", value=value))
        assert "is not a finite distance ≥ 0" in refused(wire, want)
    assert "payload 'measure' where a 'distance'" in refused(message_to_wire(gamma()), want)


def test_exact_interpolation_is_bounded_by_max_support() -> None:
    assert measure_atoms(S, "approx", None) == (S, None)
    assert measure_atoms(S, "exact", 40) == (None, 40)
    with pytest.raises(ValueError, match="set max_support"):
        measure_atoms(S, "exact", None)
    bounded = Expected("measure", "gamma", atoms=None, max_atoms=8, dim=D)
    rng = np.random.default_rng(3)
    message_from_wire(message_to_wire(gamma(rng.normal(size=(8, D)))), bounded, NODE)  # at the bound: passes
    assert "over the session's bound" in refused(message_to_wire(gamma(rng.normal(size=(9, D)))), bounded)


def test_packet_heads_and_loose_arrays_are_checked() -> None:
    fields = {"version": str, "dim": int, "converged": bool}
    assert head_refusal({"version": "v", "dim": 3, "converged": True}, fields) is None
    assert head_refusal({"version": "v", "dim": True, "converged": True}, fields) == "field 'dim' is a bool"
    assert head_refusal({"version": "v", "dim": 3, "converged": True, "x": 1}, fields) == "unexpected field(s) ['x']"
    good = Packet({}, arrays={"values": WireArray.of(np.arange(5.0))})
    assert loose_array(good, "values", (5,), NODE).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    for bad, what in ((Packet({}, arrays={"values": WireArray.of(np.arange(50.0))}), "over the bound"),
                      (Packet({}, arrays={"values": WireArray.of(np.array([0, np.nan, 0, 0, 0.0]))}), "NaN"),
                      (Packet({}, arrays={"values": WireArray.of(np.arange(5.0)), "x": WireArray.of(np.ones(1))}),
                       "where only 'values'")):
        with pytest.raises(MessageRefused, match=what):
            loose_array(bad, "values", (5,), NODE)
