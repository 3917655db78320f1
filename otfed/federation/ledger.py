"""The ledger: every message that crossed the client/server boundary, for communication-cost tables.

A :class:`Channel` is the (in-process) transport. Roles never call each other directly: they hand
messages to the channel, which records them and delivers them. The server side can only ever see what
arrived in its inbox, which is what the privacy tests inspect.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from otfed.federation.messages import Message

if TYPE_CHECKING:  # pandas only for the tables below: the protocols run without it (the core install)
    import pandas as pd


@dataclass(frozen=True)
class LedgerEntry:
    session: str
    round: int
    kind: str
    sender: str
    receiver: str
    payload: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass
class Ledger:
    """Thread-safe record of messages (Prefect tasks may share one ledger)."""

    entries: list[LedgerEntry] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __getstate__(self) -> dict:  # picklable (a result sent back from another process): not the lock
        with self._lock:
            return {"entries": list(self.entries)}

    def __setstate__(self, state: dict) -> None:
        self.entries = state["entries"]
        self._lock = threading.Lock()

    def record(self, message: Message, round: int, session: str = "") -> None:
        entry = LedgerEntry(session, round, message.kind, message.sender, message.receiver,
                            message.payload_type, tuple(message.shape), int(message.nbytes))
        with self._lock:
            self.entries.append(entry)

    def extend(self, other: "Ledger") -> None:
        with self._lock:
            self.entries.extend(other.entries)

    def to_frame(self) -> pd.DataFrame:
        """One row per message: session, round, kind, sender, receiver, payload, shape, bytes (needs pandas)."""
        import pandas as pd

        cols = ["session", "round", "kind", "sender", "receiver", "payload", "shape", "nbytes"]
        rows = [(e.session, e.round, e.kind, e.sender, e.receiver, e.payload, "x".join(map(str, e.shape)),
                 e.nbytes) for e in self.entries]
        return pd.DataFrame(rows, columns=cols)

    def cost_table(self) -> pd.DataFrame:
        """Communication cost per message kind and direction: message count and total bytes (needs pandas)."""
        import pandas as pd

        frame = self.to_frame()
        if frame.empty:
            return pd.DataFrame(columns=["kind", "sender_role", "receiver_role", "messages", "bytes"])
        frame["sender_role"] = frame["sender"].where(frame["sender"] == "server", "client")
        frame["receiver_role"] = frame["receiver"].where(frame["receiver"] == "server", "client")
        grouped = frame.groupby(["kind", "sender_role", "receiver_role"], as_index=False).agg(
            messages=("nbytes", "size"), bytes=("nbytes", "sum"))
        return grouped.sort_values("bytes", ascending=False, ignore_index=True)

    @property
    def total_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries)


class Channel:
    """In-process transport: records each message in the ledger and keeps every party's inbox."""

    def __init__(self, ledger: Ledger | None = None, session: str = "", keep_inbox: bool = False) -> None:
        self.ledger = ledger if ledger is not None else Ledger()
        self.session = session
        self.keep_inbox = keep_inbox
        self.inbox: dict[str, list[Message]] = {}
        self.round = 0

    def send(self, message: Message) -> Message:
        """Record and deliver ``message``; returns it (the receiver's copy)."""
        self.ledger.record(message, self.round, self.session)
        if self.keep_inbox:
            self.inbox.setdefault(message.receiver, []).append(message)
        return message

    def received_by(self, party: str) -> list[Message]:
        """Every message ``party`` received (needs ``keep_inbox=True``)."""
        return list(self.inbox.get(party, []))
