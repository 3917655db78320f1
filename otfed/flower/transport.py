"""A :class:`~otfed.flower.records.Packet` as a Flower ``RecordDict`` and back.

Layout: ``"head"`` — a ``ConfigRecord`` of the packet's plain values; ``"m<i>.meta"`` / ``"m<i>.arrays"`` — the
i-th typed message's metadata (``ConfigRecord``) and arrays (``ArrayRecord``, each ``Array`` with the declared
dtype, shape and raw bytes, stype ``"otfed.raw"``); ``"arrays"`` — the loose arrays. Decoding refuses any other
record name, a record of another type, or a gap in the messages' numbering, naming the sender node; the
contents are then checked by :mod:`otfed.flower.records`.

Needs ``flwr`` (the ``.venv-flower`` environment, ``make flower-setup``); it is imported when a function here is
called, so that the rest of :mod:`otfed.flower` loads without it.
"""
from __future__ import annotations

import re
from typing import Any

from otfed.flower.records import MessageRefused, Packet, WireArray, WireMessage

STYPE = "otfed.raw"
_MESSAGE_RECORD = re.compile(r"m(\d+)\.(meta|arrays)")


def _array_record(arrays: dict[str, WireArray]) -> Any:
    from flwr.app import Array, ArrayRecord

    return ArrayRecord({name: Array(dtype=a.dtype, shape=tuple(a.shape), stype=STYPE, data=a.data)
                        for name, a in arrays.items()})


def _wire_arrays(record: Any, where: str, node: str) -> dict[str, WireArray]:
    from flwr.app import ArrayRecord

    if not isinstance(record, ArrayRecord):
        raise MessageRefused(f"{node}: refused a message: record {where!r} is a {type(record).__name__}, "
                             "expected an ArrayRecord")
    out = {}
    for name, array in record.items():
        if array.stype != STYPE:
            raise MessageRefused(f"{node}: refused a message: {where}.{name} has stype {array.stype!r}, "
                                 f"expected {STYPE!r}")
        out[name] = WireArray(str(array.dtype), tuple(int(s) for s in array.shape), bytes(array.data))
    return out


def _plain(record: Any, where: str, node: str) -> dict[str, Any]:
    from flwr.app import ConfigRecord

    if not isinstance(record, ConfigRecord):
        raise MessageRefused(f"{node}: refused a message: record {where!r} is a {type(record).__name__}, "
                             "expected a ConfigRecord")
    return dict(record.items())


def packet_to_recorddict(packet: Packet) -> Any:
    """The Flower ``RecordDict`` carrying ``packet``."""
    from flwr.app import ConfigRecord, RecordDict

    records: dict[str, Any] = {"head": ConfigRecord(dict(packet.head))}
    for i, message in enumerate(packet.messages):
        records[f"m{i}.meta"] = ConfigRecord(dict(message.meta))
        records[f"m{i}.arrays"] = _array_record(dict(message.arrays))
    if packet.arrays:
        records["arrays"] = _array_record(dict(packet.arrays))
    return RecordDict(records)


def packet_from_recorddict(content: Any, node: str) -> Packet:
    """The :class:`Packet` in a received ``RecordDict``; :class:`MessageRefused` naming ``node`` for a record
    that has no place in a packet."""
    head: dict[str, Any] | None = None
    loose: dict[str, WireArray] = {}
    metas: dict[int, dict[str, Any]] = {}
    arrays: dict[int, dict[str, WireArray]] = {}
    for name, record in content.items():
        if name == "head":
            head = _plain(record, name, node)
        elif name == "arrays":
            loose = _wire_arrays(record, name, node)
        elif (match := _MESSAGE_RECORD.fullmatch(name)) is not None:
            i = int(match.group(1))
            if match.group(2) == "meta":
                metas[i] = _plain(record, name, node)
            else:
                arrays[i] = _wire_arrays(record, name, node)
        else:
            raise MessageRefused(f"{node}: refused a message: unexpected record {name!r}")
    if head is None:
        raise MessageRefused(f"{node}: refused a message: no 'head' record")
    n = len(metas)
    if set(metas) != set(range(n)) or set(arrays) != set(range(n)):
        raise MessageRefused(f"{node}: refused a message: its typed messages are numbered {sorted(metas)} "
                             f"(meta) and {sorted(arrays)} (arrays), expected 0..{n - 1} for both")
    return Packet(head, [WireMessage(metas[i], arrays[i]) for i in range(n)], loose)
