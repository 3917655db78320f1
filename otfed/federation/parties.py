"""Where the parties of a stateful protocol live, and where a party's own independent computations run.

A FedBary round has N independent client steps (each client's OT problems against its own γ_i) and N
independent server computations (η_{Q_i} and the barycentric maps, one per received γ_i). :func:`fedbary
<otfed.federation.fedbary.fedbary>` runs both through a :class:`Workers`:

* ``workers.host(clients)`` places the client objects (their private data and state) somewhere and
  returns a :class:`Hosted` handle; the protocol then only calls their methods by name and receives
  their return values — the messages. Nothing else about a client reaches the driver.
* ``workers.map(fn, calls)`` evaluates a pure function on many keyword-argument sets: the server's own
  per-client computations (inputs: its target Q and the messages it received).

:class:`InProcess` keeps everything in this process, in order (``max_workers=1``) or on threads; the
pipeline provides a Dask implementation (``flows.runners.DaskWorkers``: clients as Dask actors on the
workers, the server's computations as Dask tasks). Any implementation must return results in call order:
the protocol's random draws happen in the driver and in each party, in a fixed order, so the numbers do
not depend on where the work ran.

:func:`check_roster` is the check every multi-client protocol makes first: unique names, one dimension.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Protocol, Sequence


def check_roster(names: Sequence[str], dims: Mapping[str, Any], space: str = "feature",
                 protocol: str | None = None, augmented: Mapping[str, Any] | None = None) -> None:
    """ValueError unless the clients' ``names`` are unique and their ``dims`` (name → dimension or shape) are
    all equal; with ``protocol`` also unless there is at least one client ("<protocol> needs at least one
    client"; None: an empty roster passes). ``augmented`` (name → label-augmented dimension) is quoted in
    parentheses after ``dims`` when these differ: ``dims`` are what the user gave (the x columns), the
    augmented sizes what the protocol runs on."""
    if protocol is not None and not names:
        raise ValueError(f"{protocol} needs at least one client")
    if len(set(names)) != len(names):
        raise ValueError(f"client names must be unique, got {list(names)}")
    if len(set(dims.values())) > 1:
        also = f" (label-augmented: {dict(augmented)})" if augmented is not None else ""
        raise ValueError(f"clients have different {space} dimensions: {dict(dims)}{also}")


class Hosted(Protocol):
    """Parties placed by :meth:`Workers.host`."""

    def call(self, method: str, args: Sequence[tuple] | None = None, **kwargs: Any) -> list[Any]:
        """``party.method(*args[i], **kwargs)`` for every party i (``args`` None: no positional arguments);
        the return values in party order."""
        ...


class Workers(Protocol):
    def host(self, parties: Sequence[Any]) -> Hosted:
        ...

    def map(self, fn: Callable[..., Any], calls: Sequence[Mapping[str, Any]]) -> list[Any]:
        """``[fn(**kwargs) for kwargs in calls]``, in call order."""
        ...


class InProcess:
    """The parties as objects of this process; their steps and the server's computations run in order
    (``max_workers=1``, the default) or on ``max_workers`` threads."""

    def __init__(self, max_workers: int = 1) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be ≥ 1, got {max_workers}")
        self.max_workers = max_workers

    def _run(self, thunks: list[Callable[[], Any]]) -> list[Any]:
        if self.max_workers == 1 or len(thunks) <= 1:
            return [thunk() for thunk in thunks]
        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            return list(pool.map(lambda thunk: thunk(), thunks))

    def map(self, fn: Callable[..., Any], calls: Sequence[Mapping[str, Any]]) -> list[Any]:
        return self._run([lambda kw=kw: fn(**kw) for kw in calls])

    def host(self, parties: Sequence[Any]) -> "_Local":
        return _Local(list(parties), self)


class _Local:
    def __init__(self, parties: list[Any], workers: InProcess) -> None:
        self._parties, self._workers = parties, workers

    def call(self, method: str, args: Sequence[tuple] | None = None, **kwargs: Any) -> list[Any]:
        args = [()] * len(self._parties) if args is None else list(args)
        if len(args) != len(self._parties):
            raise ValueError(f"{method}: {len(args)} argument tuples for {len(self._parties)} parties")
        return self._workers._run([lambda p=p, a=a: getattr(p, method)(*a, **kwargs)
                                   for p, a in zip(self._parties, args)])
