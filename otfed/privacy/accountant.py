"""A client's privacy budget across sessions: a persisted accountant, one JSON ledger file per client.

:class:`~otfed.privacy.dp.DPConfig` calibrates the noise of one client's releases for ``sessions`` sessions, but
each session's client object counts its releases from zero; nothing in a single session can know how many
sessions the same records already joined. :class:`BudgetLedger` keeps that count on the client's side, in a
file: every session reserves its releases — (noise multiplier, count) — *before* its first release, the
reservation is refused with :class:`PrivacyBudgetError` (naming the client, the file, the ε
already spent and the ε the session would bring it to) when the composition of everything recorded would exceed
the client's (ε, δ), and is written atomically (a temporary file renamed over the ledger) otherwise.

**Unit of protection: one record.** The (ε, δ) bounds what all sessions recorded here reveal about any single
record of the client's data set (replace-one neighbours; :mod:`otfed.privacy.dp`), not about the data set as a
whole: a property shared by many records (the client's mean, its class balance) is not protected.

**Accounting.** Releases are Gaussian mechanisms of possibly different multipliers, chosen adaptively from public
history; their composition is accounted by ``dp-accounting`` (RDP, Mironov 2017, or its pessimistic PLD) as a
:class:`dp_accounting.ComposedDpEvent` of self-composed Gaussian events — the same accountant as
:func:`~otfed.privacy.dp.gaussian_epsilon`, which it equals for a single multiplier.

A reservation is made for a whole session up front: a session that fails midway has still spent its budget
(conservative). The ledger trusts its file: whoever can edit it can reset the budget, so it lives with the
client's data, not on the server.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import dp_accounting
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

from otfed.errors import ConfigError, OtfedError

__all__ = ["BudgetLedger", "PrivacyBudgetError", "Reservation", "composed_epsilon", "pld_interval"]

FORMAT = 1


class PrivacyBudgetError(OtfedError):
    """A DP client was asked for more releases than its (ε, δ) budget covers — in one session or, with a
    :class:`BudgetLedger`, across sessions; names the client."""


def pld_interval(mu: float) -> float:
    """PLD value discretisation for a Gaussian of GDP parameter μ: 1e-3, coarser for large μ so that the
    number of buckets (∝ μ²/interval) stays bounded (the estimate stays pessimistic, i.e. an upper bound)."""
    return 1e-3 * max(1.0, mu * mu / 100.0)


@dataclass(frozen=True)
class Reservation:
    """One session's releases: their shared noise multiplier (noise std / L2 sensitivity) and their count."""

    session: str
    noise_multiplier: float
    releases: int


def composed_epsilon(reservations: list[Reservation], delta: float, accountant: str = "rdp") -> float:
    """ε at ``delta`` of the adaptive composition of every reservation's Gaussian releases (``dp-accounting``);
    0 for no release, ``math.inf`` when any release had no noise."""
    events = [dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(r.noise_multiplier), r.releases)
              for r in reservations if r.releases > 0]
    if not events:
        return 0.0
    if any(r.noise_multiplier == 0.0 for r in reservations if r.releases > 0):
        return math.inf
    if accountant == "rdp":
        acc = RdpAccountant()
    elif accountant == "pld":
        mu = math.sqrt(sum(r.releases / r.noise_multiplier ** 2 for r in reservations if r.releases > 0))
        acc = PLDAccountant(value_discretization_interval=pld_interval(mu))
    else:
        raise ValueError(f"unknown accountant {accountant!r}; allowed values: rdp, pld")
    return float(acc.compose(dp_accounting.ComposedDpEvent(events)).get_epsilon(float(delta)))


class BudgetLedger:
    """The persisted privacy budget of one client: (ε, δ) for all its sessions together, and every session's
    reservation, in the JSON file ``path`` (created on the first reservation).

    Parameters:
        path: the ledger file (one per client).
        client: the client's name (checked against the file's).
        epsilon, delta: the client's total budget (checked against the file's: a ledger keeps its budget).
        accountant: ``"rdp"`` or ``"pld"`` (checked against the file's).

    Raises :class:`~otfed.errors.ConfigError` when the file exists for another client, another budget or another
    accountant, or cannot be read as a ledger.

    Two sessions whose noise was calibrated for one: the second is refused before it releases anything, and ε
    spent is the accountant's ε of the first alone:

    >>> import tempfile
    >>> from otfed.privacy.dp import gaussian_epsilon, gaussian_noise_multiplier
    >>> z = gaussian_noise_multiplier(1.0, 1e-5, 11)
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     ledger = BudgetLedger(Path(folder) / "a.json", "a", epsilon=1.0, delta=1e-5)
    ...     _ = ledger.reserve("a|b", z, 11)
    ...     again = BudgetLedger(Path(folder) / "a.json", "a", epsilon=1.0, delta=1e-5)
    ...     try:
    ...         again.reserve("a|c", z, 11)
    ...     except PrivacyBudgetError as exc:
    ...         print("refused:", "'a'" in str(exc))
    ...     print(again.spent() == gaussian_epsilon(z, 11, 1e-5), len(again.reservations))
    refused: True
    True 1
    """

    def __init__(self, path: str | Path, client: str, epsilon: float, delta: float, accountant: str = "rdp") -> None:
        self.path = Path(path)
        self.client = client
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self.accountant = accountant
        self.reservations: list[Reservation] = []
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
            stored = (data["client"], float(data["epsilon"]), float(data["delta"]), data["accountant"])
            reservations = [Reservation(str(r["session"]), float(r["noise_multiplier"]), int(r["releases"]))
                            for r in data["reservations"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"privacy ledger {self.path}: not a readable ledger ({exc})") from exc
        wanted = (self.client, self.epsilon, self.delta, self.accountant)
        if stored != wanted:
            raise ConfigError(f"privacy ledger {self.path} belongs to client {stored[0]!r} with budget (ε={stored[1]}, "
                              f"δ={stored[2]}, {stored[3]}); asked for client {self.client!r} with (ε={self.epsilon}, "
                              f"δ={self.delta}, {self.accountant}) — a ledger keeps its client and its budget")
        self.reservations = reservations

    def spent(self) -> float:
        """ε spent by every reservation recorded (:func:`composed_epsilon`)."""
        return composed_epsilon(self.reservations, self.delta, self.accountant)

    def epsilon_after(self, noise_multiplier: float, releases: int) -> float:
        """ε the ledger would record after reserving ``releases`` more releases at ``noise_multiplier``."""
        return composed_epsilon(self.reservations + [Reservation("", noise_multiplier, releases)], self.delta,
                                self.accountant)

    def reserve(self, session: str, noise_multiplier: float, releases: int) -> float:
        """Record ``releases`` releases at ``noise_multiplier`` for ``session`` and return the ε spent after them;
        :class:`PrivacyBudgetError` naming the client and the file, and nothing written, when
        they would take the ledger past its ε (an infinite ε budget never refuses)."""
        if releases < 0 or not noise_multiplier >= 0:
            raise ValueError(f"need releases ≥ 0 and noise_multiplier ≥ 0 (got {releases}, {noise_multiplier})")
        after = self.epsilon_after(noise_multiplier, releases)
        if after > self.epsilon:
            raise PrivacyBudgetError(
                f"client {self.client!r}: session {session!r} refused — its {releases} releases would bring the ε "
                f"spent from {self.spent():.6g} to {after:.6g}, over the budget ε={self.epsilon} (δ={self.delta}) "
                f"recorded in {self.path} across {len(self.reservations)} earlier session(s)")
        self.reservations.append(Reservation(session, float(noise_multiplier), int(releases)))
        self._save()
        return after

    def _save(self) -> None:
        data = {"format": FORMAT, "client": self.client, "epsilon": self.epsilon, "delta": self.delta,
                "accountant": self.accountant,
                "reservations": [{"session": r.session, "noise_multiplier": r.noise_multiplier,
                                  "releases": r.releases} for r in self.reservations]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(data, handle, indent=1)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
