"""Test support for the privacy boundary (DESIGN "the privacy boundary is code"): an inspector of everything the
server received, and clients that live in another process, so that the server side reaches them only through
their protocol methods.

:class:`BoundaryInspector` walks every field of every object it is given — dataclass fields, extra attributes in
``__dict__`` and ``__slots__``, nested tuples / lists / sets / dicts (keys too), numpy arrays of any shape and
dtype (object arrays element by element), torch tensors, Python and numpy scalars, strings — not only a message's
``arrays()``, and fails loudly (:class:`UninspectableField`) on anything else (bytes, complex numbers, models,
arbitrary objects): a field it cannot read is a field it cannot clear. Every numeric value it meets goes into
one stream, in the order met, and every array of two or more dimensions is also read along each of its other
axes; every window of length d of these sequences is a candidate vector (d: the width of a private array). This
covers rows of width d, columns of a d×n or n×d×… array, a d×1 measure, a sample spread over d scalars of
consecutive fields or messages, and a sample embedded anywhere in a longer row (the raw x inside a
label-augmented [x; m_y; s_y] row). It returns an :class:`Inspection` that counts what it read (objects,
fields, extra attributes, arrays, values, vectors, strings), so a test can assert that it checked something
and, by comparing ``values`` with an independent count, that nothing was skipped.

The threshold. A candidate vector v is a near-copy of a private sample x of client c when
``‖v − x‖ ≤ τ_c = relative × NN_c``, NN_c the median distance from a sample of c to its nearest other sample
(zero distances of duplicates left out) and ``relative`` = 1e-3 by default: v pins x down to a thousandth of
the distance that separates the client's own samples, so the server knows that sample whatever noise was
added (a sample + 1e-4 on every coordinate sits at 0.15–0.5 τ_c on the tests' data). Honest messages carry
interpolating measures: atoms z = (1 − t)·ξ + t·T(ξ), T(ξ) a barycentric projection, i.e. a convex combination
of samples (FedWaD eqs. 5 and 10, FedBary eq. 7). A mean of two or more samples lies about half a neighbour
distance from each, far above τ_c; so z comes within τ_c of a sample x only if T(ξ) = x (a permutation plan:
S = n, the embedded-size case) *and* (1 − t)·‖ξ − x‖ ≤ τ_c, i.e. if the privately drawn t lands within
τ_c / ‖ξ − x‖ ≈ relative × NN_c / ‖ξ − x‖ of 1 — then the message does carry the client's data (an
honest-protocol exposure, which the inspector rightly flags; see
test_a_fixed_t_near_one_sends_near_copies_of_the_data_and_is_flagged). Measured on 160 seeded FedWaD runs at
S = n = 40 (approx and exact, d = 2 and 5): none flagged at 1e-3, closest vector 1.3 τ_c (d = 2) and 2.2 τ_c
(d = 5); at 1e-2, 9 of 40 runs (S ≤ n ≤ 100, d = 2–10) were flagged, e.g. where t = 0.994 put a client's whole
dataset within 0.7 % of NN_c. On the honest runs of tests/federation/ every vector stays ≥ 5 τ_c from every
sample (:attr:`Inspection.closest`).

Strings are checked against the clients' private texts (case and white space folded): a field that contains a
private text of at least ``min_text_length`` characters is a leak.

:class:`IsolatedParty` (:func:`isolated_parties` for several) builds a party — a client — with its factory
inside a forked process and is the server side's only handle on it: its public metadata (``name``, ``dim``)
and its protocol methods, each call a request over a pipe and each answer a pickled copy of the messages. Any
other attribute read or write raises :class:`BoundaryViolation`, and the party object does not exist in the
server's process at all, so a driver or server method that reads ``client._measure`` (directly, or through its
caller's frame) fails.

What this does not catch: a sample transformed before it is sent (scaled, rotated, coordinates permuted or
strided, encoded as bytes — bytes fail loudly instead), information spread over many messages and recovered by
computation (e.g. FedBary's barycentric-projection caveat, its module docstring), and server code that scans
its own process's memory for the arrays the test itself holds.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import multiprocessing
import pickle
import re
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
from scipy.spatial import cKDTree

from tests.ceilings import ceiling, hit

#: τ_c = RELATIVE_THRESHOLD × (median within-client nearest-neighbour distance); see the module docstring.
RELATIVE_THRESHOLD = 1e-3
#: Candidates are compared exactly within WATCH × τ_c, so that :attr:`Inspection.closest` reports the margin.
WATCH = 10.0
_CHUNK = 200_000  # candidate (vector, sample) pairs compared at once


class UninspectableField(TypeError):
    """A field of a type the inspector cannot read (so cannot clear): the boundary check fails loudly."""


class BoundaryViolation(AssertionError):
    """Server-side code reached a client other than through its protocol methods."""


@dataclass(frozen=True)
class Leak:
    """One near-copy: where it was found, whose sample, how close (and the client's threshold)."""

    path: str
    client: str
    sample: int
    distance: float
    threshold: float
    width: int = 0  # the private array's width d (0: a text)

    def __str__(self) -> str:
        return (f"{self.path}: within {self.distance:.3g} of {self.client}'s sample #{self.sample} "
                f"(threshold {self.threshold:.3g})")


@dataclass
class Inspection:
    """What the inspector read, and the leaks it found.

    ``objects``: dataclass instances walked; ``fields``: every attribute, element and key visited;
    ``extra_attributes``: attributes found in ``__dict__`` / ``__slots__`` beyond the dataclass fields;
    ``arrays``: numeric arrays and scalars; ``values``: numbers read; ``vectors``: candidate vectors compared
    with the private samples (windows, summed over the private widths); ``strings``: strings compared with the
    private texts; ``closest``: the smallest distance/τ_c of any vector to any private sample, ≥ WATCH when
    none came within WATCH × τ_c (the margin of an honest run).
    """

    roots: int = 0
    objects: int = 0
    fields: int = 0
    extra_attributes: int = 0
    arrays: int = 0
    values: int = 0
    vectors: int = 0
    strings: int = 0
    closest: float = WATCH
    leaks: list[Leak] = field(default_factory=list)
    types: collections.Counter = field(default_factory=collections.Counter)

    @property
    def clean(self) -> bool:
        return not self.leaks

    def summary(self) -> str:
        verdict = (f"no leak (closest vector {self.closest:.3g} × threshold)" if self.clean
                   else f"{len(self.leaks)} leak(s), first: {self.leaks[0]}")
        return (f"inspected {self.roots} items: {self.objects} objects, {self.fields} fields "
                f"({self.extra_attributes} extra attributes), {self.arrays} arrays, {self.values} values, "
                f"{self.vectors} vectors, {self.strings} strings; {verdict}")

    def assert_clean(self) -> "Inspection":
        """AssertionError listing the leaks, or if nothing numeric was inspected; else ``self``."""
        if self.leaks:
            shown = "\n  ".join(str(leak) for leak in self.leaks[:5])
            raise AssertionError(f"the server received near-copies of private samples:\n  {shown}\n"
                                 f"({self.summary()})")
        if self.values == 0 or self.vectors == 0:
            raise AssertionError(f"the boundary check inspected nothing: {self.summary()}")
        return self


@dataclass
class _Space:
    """The private samples of one width, every client together (sorted on the pivot coordinate)."""

    width: int
    samples: np.ndarray  # (n, d), sorted by samples[:, pivot]
    pivot_values: np.ndarray
    pivot: int
    owner: np.ndarray  # client index per row
    index: np.ndarray  # row index in the client's own array
    tau: np.ndarray  # τ of the owner, per row


@dataclass
class _Walk:
    inspection: Inspection
    stream: list[tuple[str, np.ndarray]] = field(default_factory=list)  # C-order values, in visit order
    axes: list[tuple[str, np.ndarray]] = field(default_factory=list)  # other axes of ≥ 2-D arrays
    strings: list[tuple[str, str]] = field(default_factory=list)


def nearest_neighbour_scale(samples: np.ndarray) -> float:
    """The median distance from a sample to its nearest other sample (duplicates left out)."""
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2 or not np.isfinite(x).all():
        raise ValueError(f"private samples must be a finite n×d array with n ≥ 2, got shape {x.shape}")
    distances, _ = cKDTree(x).query(x, k=2)
    positive = distances[:, 1][distances[:, 1] > 0]
    if positive.size == 0:
        raise ValueError("private samples are all identical: no nearest-neighbour scale")
    return float(np.median(positive))


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def _is_tensor(obj: Any) -> bool:
    return type(obj).__module__.split(".")[0] == "torch" and hasattr(obj, "detach") and hasattr(obj, "numpy")


class BoundaryInspector:
    """Flags near-copies of the clients' private samples (and texts) in anything the server received.

    ``private``: client name → its private array (n×d), or several (e.g. raw features and label-augmented
    samples; each is checked in its own width); ``texts``: client name → its private texts. See the module
    docstring for the threshold ``relative``.
    """

    def __init__(self, private: Mapping[str, np.ndarray | Sequence[np.ndarray]],
                 texts: Mapping[str, Sequence[str]] | None = None, relative: float = RELATIVE_THRESHOLD,
                 min_text_length: int = 12) -> None:
        if not private and not texts:
            raise ValueError("nothing private to look for")
        if not relative > 0:
            raise ValueError(f"relative threshold must be > 0, got {relative}")
        self.relative = relative
        self.clients = list(dict.fromkeys([*private, *(texts or {})]))
        self.thresholds: dict[tuple[str, int], float] = {}
        by_width: dict[int, list[tuple[int, np.ndarray, float]]] = {}
        for name, arrays in private.items():
            arrays = [arrays] if isinstance(arrays, np.ndarray) else list(arrays)
            for x in arrays:
                x = np.asarray(x, dtype=np.float64)
                tau = relative * nearest_neighbour_scale(x)
                self.thresholds[(name, x.shape[1])] = tau
                by_width.setdefault(x.shape[1], []).append((self.clients.index(name), x, tau))
        self._spaces = [self._space(width, parts) for width, parts in sorted(by_width.items())]
        self._texts = [(name, i, _normalise(t)) for name, ts in (texts or {}).items() for i, t in enumerate(ts)
                       if len(_normalise(t)) >= min_text_length]

    @staticmethod
    def _space(width: int, parts: list[tuple[int, np.ndarray, float]]) -> _Space:
        samples = np.vstack([x for _, x, _ in parts])
        owner = np.concatenate([np.full(len(x), c) for c, x, _ in parts])
        index = np.concatenate([np.arange(len(x)) for _, x, _ in parts])
        tau = np.concatenate([np.full(len(x), t) for _, x, t in parts])
        # pivot: the coordinate with the most distinct values (any vector within τ of x is within τ of x on it)
        distinct = [len(np.unique(samples[:, k])) + np.std(samples[:, k]) / (1 + np.ptp(samples)) for k in
                    range(width)]
        pivot = int(np.argmax(distinct))
        order = np.argsort(samples[:, pivot], kind="stable")
        return _Space(width, samples[order], samples[order, pivot], pivot, owner[order], index[order], tau[order])

    # ------------------------------------------------------------------------------------------ walking
    def inspect(self, received: Iterable[Any]) -> Inspection:
        """Walk every item of ``received`` (messages, or any server-side object built from them) and compare
        every candidate vector and string with the private data. Raises :class:`UninspectableField`."""
        walk = _Walk(Inspection())
        for i, item in enumerate(received):
            walk.inspection.roots += 1
            label = f"[{i}] {type(item).__name__}"
            if hasattr(item, "kind") and hasattr(item, "sender"):
                label += f"({getattr(item, 'kind')!r} from {getattr(item, 'sender')!r})"
            self._walk(item, label, walk, set())
        for space in self._spaces:
            self._compare(space, walk.stream, walk.inspection)
            for path, values in walk.axes:
                self._compare(space, [(path, values)], walk.inspection)
        for path, text in walk.strings:
            folded = _normalise(text)
            for name, i, secret in self._texts:
                if secret in folded:
                    walk.inspection.leaks.append(Leak(f"{path} (text)", name, i, 0.0, 0.0))
        return walk.inspection

    def _walk(self, obj: Any, path: str, walk: _Walk, stack: set[int]) -> None:
        result = walk.inspection
        result.fields += 1
        result.types[type(obj).__name__] += 1
        if obj is None:
            return
        if isinstance(obj, str):
            result.strings += 1
            walk.strings.append((path, obj))
            return
        if isinstance(obj, (bool, int, float, np.bool_, np.integer, np.floating)):
            self._numeric(np.asarray(obj), path, walk)
            return
        if isinstance(obj, np.ndarray):
            self._array(obj, path, walk, stack)
            return
        if _is_tensor(obj):
            self._array(obj.detach().cpu().numpy(), f"{path} (tensor)", walk, stack)
            return
        if id(obj) in stack:
            return  # a cycle: this object is already being walked further up the same path
        stack.add(id(obj))
        try:
            if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
                self._dataclass(obj, path, walk, stack)
            elif isinstance(obj, Mapping):
                for key, value in obj.items():
                    self._walk(key, f"{path}[key {key!r}]", walk, stack)
                    self._walk(value, f"{path}[{key!r}]", walk, stack)
            elif isinstance(obj, (list, tuple, collections.deque)):
                for i, value in enumerate(obj):
                    self._walk(value, f"{path}[{i}]", walk, stack)
            elif isinstance(obj, (set, frozenset)):
                for i, value in enumerate(sorted(obj, key=repr)):
                    self._walk(value, f"{path}{{{i}}}", walk, stack)
            else:
                raise UninspectableField(f"{path}: cannot inspect a {type(obj).__module__}.{type(obj).__qualname__}"
                                         " — the boundary check reads dataclasses, containers, arrays, tensors, "
                                         "numbers and strings only")
        finally:
            stack.discard(id(obj))

    def _dataclass(self, obj: Any, path: str, walk: _Walk, stack: set[int]) -> None:
        walk.inspection.objects += 1
        names = [f.name for f in dataclasses.fields(obj)]
        missing = object()
        for name in names:
            value = getattr(obj, name, missing)
            if value is not missing:
                self._walk(value, f"{path}.{name}", walk, stack)
        extra = [k for k in getattr(obj, "__dict__", {}) if k not in names]
        slots = [s for cls in type(obj).__mro__ for s in getattr(cls, "__slots__", ())
                 if s not in names and s not in ("__dict__", "__weakref__")]
        for name in dict.fromkeys([*extra, *slots]):
            value = getattr(obj, name, missing)
            if value is not missing:
                walk.inspection.extra_attributes += 1
                self._walk(value, f"{path}.{name} (extra attribute)", walk, stack)

    def _array(self, array: np.ndarray, path: str, walk: _Walk, stack: set[int]) -> None:
        kind = array.dtype.kind
        if kind in "biuf":
            self._numeric(array, path, walk)
        elif kind in "US":
            for index, value in np.ndenumerate(array):
                walk.inspection.strings += 1
                walk.strings.append((f"{path}{list(index)}", str(value)))
        elif kind == "O":
            for index, value in np.ndenumerate(array):
                self._walk(value, f"{path}{list(index)}", walk, stack)
        else:
            raise UninspectableField(f"{path}: cannot inspect an array of dtype {array.dtype}")

    @staticmethod
    def _numeric(array: np.ndarray, path: str, walk: _Walk) -> None:
        values = np.asarray(array, dtype=np.float64)
        walk.inspection.arrays += 1
        walk.inspection.values += values.size
        walk.stream.append((path, values.ravel()))
        for axis in range(values.ndim - 1):
            walk.axes.append((f"{path} (axis {axis} of shape {values.shape})", np.moveaxis(values, axis, -1).ravel()))

    # --------------------------------------------------------------------------------------- comparing
    def _compare(self, space: _Space, segments: list[tuple[str, np.ndarray]], result: Inspection) -> None:
        """Every window of length d of the concatenated ``segments`` against every private sample of width d:
        exact within WATCH × τ (a window within r of x is within r of it on the pivot coordinate)."""
        if not segments:
            return
        sequence = np.concatenate([values for _, values in segments])
        d = space.width
        m = sequence.size - d + 1
        if m <= 0:
            return
        result.vectors += m
        starts = np.cumsum([0] + [values.size for _, values in segments[:-1]])
        radius = WATCH * float(space.tau.max())
        pivots = sequence[space.pivot: space.pivot + m]
        lo = np.searchsorted(space.pivot_values, pivots - radius, side="left")
        hi = np.searchsorted(space.pivot_values, pivots + radius, side="right")
        counts = np.where(np.isfinite(pivots), hi - lo, 0)
        total = int(counts.sum())
        if total == 0:
            return
        windows = np.lib.stride_tricks.sliding_window_view(sequence, d)
        position = np.repeat(np.arange(m), counts)
        offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        row = np.repeat(lo, counts) + offsets
        for begin in range(0, total, _CHUNK):
            p, r = position[begin:begin + _CHUNK], row[begin:begin + _CHUNK]
            with np.errstate(invalid="ignore"):
                distance = np.linalg.norm(windows[p] - space.samples[r], axis=1)
            ratio = distance / space.tau[r]
            if np.isfinite(ratio).any():
                result.closest = min(result.closest, float(np.nanmin(ratio)))
            for j in np.flatnonzero(ratio <= 1.0):
                segment = bisect.bisect_right(starts, p[j]) - 1
                path = segments[segment][0]
                offset = int(p[j] - starts[segment])
                where = f"{path} @ offset {offset}" + (" (spans later fields)" if offset + d > segments[segment][1]
                                                         .size else "")
                result.leaks.append(Leak(where, self.clients[space.owner[r[j]]], int(space.index[r[j]]),
                                         float(distance[j]), float(space.tau[r[j]]), d))


def inspect_boundary(received: Iterable[Any], private: Mapping[str, np.ndarray | Sequence[np.ndarray]],
                     texts: Mapping[str, Sequence[str]] | None = None, **options: Any) -> Inspection:
    """:meth:`BoundaryInspector.inspect` of ``received`` for these private arrays / texts."""
    return BoundaryInspector(private, texts, **options).inspect(received)


def assert_boundary_holds(received: Iterable[Any], private: Mapping[str, np.ndarray | Sequence[np.ndarray]],
                          texts: Mapping[str, Sequence[str]] | None = None, **options: Any) -> Inspection:
    """:func:`inspect_boundary`, failing on any leak or if nothing was inspected; returns the counts."""
    received = list(received)
    if not received:
        raise AssertionError("the server received nothing to inspect (was the channel built with keep_inbox=True?)")
    return inspect_boundary(received, private, texts, **options).assert_clean()


# ---------------------------------------------------------------------------------------- isolation
_FORK = multiprocessing.get_context("fork")
#: Longest wait for an isolated party's answer before calling it a hang (× OTFED_TEST_TIME_FACTOR).
ANSWER_CEILING_S = 120.0


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else a RuntimeError carrying its text."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 — any unpicklable exception is replaced by its text
        return RuntimeError(f"{type(error).__name__}: {error}")


def _serve(factory: Callable[[], Any], conn: Any, methods: tuple[str, ...], public: tuple[str, ...]) -> None:
    """The party's process: build the party, announce its public metadata, answer method calls until told
    to stop (``None``). Only ``methods`` are served."""
    try:
        party = factory()
        conn.send(("ok", {name: getattr(party, name) for name in public}))
    except BaseException as error:  # noqa: BLE001 — reported to the caller
        conn.send(("error", _portable(error), traceback.format_exc()))
        return
    while True:
        request = conn.recv()
        if request is None:
            break
        method, args, kwargs = request
        try:
            if method not in methods:
                raise BoundaryViolation(f"{method!r} is not a protocol method")
            answer = getattr(party, method)(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 — reported to the caller
            conn.send(("error", _portable(error), traceback.format_exc()))
        else:
            conn.send(("ok", answer))
    conn.close()


class IsolatedParty:
    """The server side's handle on a party living in another process: its public metadata and its protocol
    methods (each call pickled over a pipe, each answer a copy). Anything else is a :class:`BoundaryViolation`."""

    def __init__(self, factory: Callable[[], Any], methods: Sequence[str], public: Sequence[str] = ("name",)) -> None:
        parent, child = _FORK.Pipe()
        process = _FORK.Process(target=_serve, args=(factory, child, tuple(methods), tuple(public)), daemon=True)
        process.start()
        child.close()
        vars(self).update(_conn=parent, _process=process, _methods=tuple(methods), _public={})
        vars(self)["_public"] = self._receive("start")

    def _receive(self, what: str) -> Any:
        if not self._conn.poll(ceiling(ANSWER_CEILING_S)):
            raise TimeoutError(hit(f"an isolated party's answer to {what}", ANSWER_CEILING_S))
        try:
            status, answer, *remote = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"the isolated party's process ended during {what} "
                               f"(exit code {self._process.exitcode})") from None
        if status == "error":
            answer.add_note(f"raised in the isolated party's process:\n{remote[0]}")
            raise answer
        return answer

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self._conn.send((method, args, kwargs))
        return self._receive(method)

    def __getattr__(self, name: str) -> Any:
        state = vars(self)
        if name in state.get("_public", {}):
            return state["_public"][name]
        if name in state.get("_methods", ()):
            return functools.partial(self._call, name)
        who = state.get("_public", {}).get("name", "?")
        raise BoundaryViolation(f"server-side code read {name!r} of client {who!r}: a client is reachable only "
                                f"through its protocol methods {state.get('_methods')} and the channel")

    def __setattr__(self, name: str, value: Any) -> None:
        raise BoundaryViolation(f"server-side code tried to set {name!r} on client {self._public.get('name')!r}")

    def close(self) -> None:
        """Stop the party's process (waits for its exit under a hang ceiling, then kills it)."""
        if self._process.is_alive():
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._process.join(ceiling(30.0))
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
        self._conn.close()


@contextmanager
def isolated_parties(factories: Sequence[Callable[[], Any]], methods: Sequence[str],
                     public: Sequence[str] = ("name", "dim")) -> Iterator[list[IsolatedParty]]:
    """One :class:`IsolatedParty` per factory (each builds its party inside its own process), closed on exit."""
    parties: list[IsolatedParty] = []
    try:
        for factory in factories:
            parties.append(IsolatedParty(factory, methods, public))
        yield parties
    finally:
        for party in parties:
            party.close()
