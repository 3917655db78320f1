"""FedBary's results in the forms the data-valuation libraries use: pandas tables, pyDVL's ``ValuationResult`` and
an OpenDataVal ``DataEvaluator`` for datum values.

* :func:`contributions_frame` — one row per client: its contribution (percent, FedBary §4.2), its distance to
  Q (the closing round's upper bound on W(P_i, Q)), and, from :func:`~otfed.federation.fedbary.valuation_spread`,
  the mean, standard deviation and confidence interval of its share over the reruns;
* :func:`datum_values_frame` — one row per datum: client, row, calibrated gradient g (FedBary eq. 10; larger =
  more suspicious), whether its client's dual potential converged;
* :func:`to_pydvl` — client contributions as a pyDVL ``ValuationResult`` (pyDVL's convention: a value estimate per
  player with a sample variance and a count of samples; here the players are the clients);
* :class:`FedBaryDataValues` / :func:`opendataval_evaluator` — OpenDataVal's ``DataEvaluator`` protocol
  (``input_data`` → ``train_data_values`` → ``evaluate_data_values``) for FedBary's datum values: the training
  rows are split into clients, the validation set is the server's Q, and each row's value is −g (OpenDataVal's
  convention, as its LAVA evaluator's: low values are detrimental points).

pandas, pyDVL and OpenDataVal are imported only when these functions run: the core install needs none of them.
pandas comes with the ``text`` and ``valuation`` extras. pyDVL and OpenDataVal are not extras: the newest releases
on PyPI (pyDVL 0.10.0, OpenDataVal 1.3.0) declare ``numpy<2`` and ``numpy<1.26, pandas<2, torch~=2.1``, so pip
cannot resolve either next to otfed's numpy 2.4, pandas 3.1 and torch 2.13. Their code runs with those pins all the
same; install them beside otfed's packages without their declared dependencies, as ``make test`` does::

    pip install --no-deps --target .venv/conformance -r requirements-conformance.txt

and put that folder at the *end* of ``sys.path`` (``PYTHONPATH=.venv/conformance``, or ``sys.path.append``), so that
otfed's pinned packages come first. ``requirements-conformance.txt`` pins pyDVL 0.10.0, OpenDataVal 1.3.0 and the
four modules their imports need that otfed's lock lacks (pyDeprecate, more-itertools, cvxpy, qdldl). The caveat of
``--no-deps``: pip checks nothing — the libraries run against versions they never declared, and only what the
tests exercise is known to work (tests/federation/test_adapters.py: pyDVL's own running moments and sums,
OpenDataVal's ``DataFetcher`` → ``train`` → ``noisy_detection``).

OpenDataVal 1.3.0 does not import as published next to otfed's pins, for two reasons outside the evaluator's path;
:func:`opendataval_evaluator` imports it with both accommodated:

* its LAVA evaluator imports ``geomloss.utils``, which geomloss 0.3 moved to ``geomloss._legacy.utils`` (the same
  functions): the adapter makes the old name point to them;
* its package import registers its image data sets, which import torchvision at once. PyPI's torchvision wheels are
  built against PyPI's CUDA torch and do not load next to a CPU build of torch 2.13.0 (the one otfed's CPU install
  uses): where torchvision is not installed, the adapter imports OpenDataVal without its image data sets (an
  empty ``opendataval.dataloader.datasets.imagesets``). With torch from PyPI, ``pip install --no-deps
  torchvision==0.28.0`` (the release built for torch 2.13.0) brings them back.
"""
from __future__ import annotations

import functools
import importlib.util
import sys
import types
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from otfed.federation.fedbary import FedBaryConfig, FedBaryResult, federated_valuation
from otfed.ot.otdd import LabelledData
from otfed.schema import as_config
from otfed.valuation.calibrated import Potential

if TYPE_CHECKING:  # optional libraries: imported where they are used
    import pandas

#: The pyDVL release the adapter was written against (``pydvl.valuation.result.ValuationResult``).
PYDVL_VERSION = "0.10.0"


def _pandas():
    try:
        import pandas
    except ImportError as exc:  # the core install has no pandas
        raise ImportError("pandas is needed for a DataFrame: pip install 'otfed[valuation]' (or pandas)") from exc
    return pandas


def contributions_frame(result: FedBaryResult) -> "pandas.DataFrame":
    """FedBary's client valuation (FedBary §4.2) as a table, one row per client in the session's order.

    Columns: ``client``, ``contribution`` (percent of this run, summing to 100), ``distance`` (the closing round's
    upper bound on W(P_i, Q)); with a spread (:func:`~otfed.federation.fedbary.valuation_spread`) also ``runs``,
    ``mean`` and ``std`` of the share over the runs, and ``ci_low`` / ``ci_high``, the ``level`` confidence
    interval of the mean. The same table as :meth:`FedBaryResult.to_dataframe
    <otfed.federation.fedbary.FedBaryResult.to_dataframe>`.

    Parameters:
        result: a FedBary session's result (:func:`~otfed.federation.fedbary.federated_valuation` or
            :func:`~otfed.federation.fedbary.valuation_spread`).

    Returns:
        A pandas DataFrame, one row per client, in ``result.names`` order.

    >>> from otfed.federation.fedbary import valuation_spread
    >>> rng = np.random.default_rng(0)
    >>> y = np.repeat([0, 1], 20)
    >>> clients = [LabelledData(f"c{i}", rng.normal(size=(40, 2)) + 3.0 * y[:, None] + s, y)
    ...            for i, s in enumerate([0.0, 0.0, 2.0])]
    >>> table = contributions_frame(valuation_spread(clients, FedBaryConfig(support_size=10, iterations=3), seeds=[0, 1]))
    >>> table.columns.tolist()
    ['client', 'contribution', 'distance', 'runs', 'mean', 'std', 'ci_low', 'ci_high']
    >>> round(float(table["contribution"].sum()), 9), table["client"].tolist()
    (100.0, ['c0', 'c1', 'c2'])
    """
    _pandas()
    return result.to_dataframe()


def datum_values_frame(result: FedBaryResult) -> "pandas.DataFrame":
    """FedBary's datum values (calibrated gradients, FedBary eq. 10) as a long table: one row per datum, columns
    ``client``, ``row`` (its index in that client's data), ``value`` (g: larger = farther from Q = more suspicious)
    and ``converged`` (whether the client's dual potential met its tolerance; None where the result does not say).
    ValueError if the session computed no datum values (``federated_valuation(..., datum_values=True)``).

    Parameters:
        result: a FedBary result with ``datum_values``.

    Returns:
        A pandas DataFrame, the clients in ``result.names`` order, each client's rows in its data's order.

    >>> rng = np.random.default_rng(0)
    >>> y = np.repeat([0, 1], 10)
    >>> clients = [LabelledData(f"c{i}", rng.normal(size=(20, 2)) + 3.0 * y[:, None], y) for i in range(2)]
    >>> result = federated_valuation(clients, FedBaryConfig(support_size=10, iterations=3), datum_values=True)
    >>> table = datum_values_frame(result)
    >>> len(table), table.columns.tolist()
    (40, ['client', 'row', 'value', 'converged'])
    >>> bool((table[table.client == "c1"]["value"].to_numpy() == result.datum_values["c1"]).all())
    True
    """
    pandas = _pandas()
    if result.datum_values is None:
        raise ValueError("this FedBary result has no datum values: run federated_valuation(..., datum_values=True)")
    convergence = getattr(result, "datum_convergence", None) or {}
    frames = []
    for name in result.names:
        values = np.asarray(result.datum_values[name])
        state = convergence.get(name)
        converged = None if state is None else bool(getattr(state, "converged", None))
        frames.append(pandas.DataFrame({"client": name, "row": np.arange(values.size), "value": values,
                                        "converged": [converged] * values.size}))
    return pandas.concat(frames, ignore_index=True)


def to_pydvl(result: FedBaryResult, algorithm: str = "otfed.FedBary") -> Any:
    """FedBary's client contributions (FedBary §4.2) as a pyDVL ``ValuationResult`` over the clients.

    pyDVL stores, per player, a value estimate, the sample variance behind it and the number of samples (its
    ``stderr`` is √(variance / count)). With a spread (:func:`~otfed.federation.fedbary.valuation_spread`) the
    value is the mean share over the runs, the variance the runs' sample variance (ddof = 1, ``spread.std²``) and
    the count the number of runs; without one, the single run's shares with variance 0 and count 1. The
    ``data_names`` are the client names, ``indices`` 0…n−1 in the session's order; the status is ``Converged``
    in pyDVL's sense (the run finished: pyDVL knows Pending, Converged and Failed) — FedBary stops after its fixed
    K rounds, not on a convergence test, so how far the shares can be read is the spread's to say.

    This is the result pyDVL's own samplers would hand back had they fed each run's shares to its
    ``LogResultUpdater`` (running moments, unbiased variance): values, variances and counts agree to rounding
    (tests/federation/test_adapters.py). pyDVL's ``+`` pools two results' means and counts exactly but combines their
    variances as population (ddof = 0) variances, so a sum's variances are pyDVL's approximation, not the pooled
    runs' sample variance.

    Raises ImportError naming the conflict when pyDVL is not importable.

    Parameters:
        result: a FedBary result, with a spread for variances (:func:`~otfed.federation.fedbary.valuation_spread`).
        algorithm: the name pyDVL records (its DataFrame's column names).

    Returns:
        A ``pydvl.valuation.result.ValuationResult`` over the clients.
    """
    try:
        from pydvl.utils.status import Status
        from pydvl.valuation.result import ValuationResult
    except ImportError as exc:
        raise ImportError(f"to_pydvl needs pyDVL (written against {PYDVL_VERSION}, pydvl.valuation.result). Its "
                          f"PyPI releases declare numpy<2, which otfed's numpy 2.4 pin excludes: pip install "
                          f"--no-deps --target .venv/conformance -r requirements-conformance.txt and append that "
                          f"folder to sys.path (otfed.federation.adapters says why)") from exc
    names = np.asarray(list(result.names))
    if result.spread is not None:
        values = np.asarray(result.spread.mean, dtype=np.float64)
        variances = np.asarray(result.spread.std, dtype=np.float64) ** 2
        counts = np.full(values.size, len(result.spread.seeds), dtype=np.int_)
    else:
        values = np.asarray(result.contributions, dtype=np.float64)
        variances = np.zeros_like(values)
        counts = np.ones(values.size, dtype=np.int_)
    return ValuationResult(values=values, variances=variances, counts=counts, indices=np.arange(values.size),
                           data_names=names, algorithm=algorithm, status=Status.Converged)


class FedBaryDataValues:
    """FedBary's datum values behind OpenDataVal's ``DataEvaluator`` protocol: ``input_data(x_train, y_train,
    x_valid, y_valid)``, ``train_data_values()``, ``evaluate_data_values()`` (and the cached ``data_values``).

    The training rows are split into clients — ``clients`` gives each row's client (any labels), else the rows
    are cut into ``n_clients`` contiguous blocks — and FedBary runs with the validation set as the server's Q
    (:func:`~otfed.federation.fedbary.federated_valuation` with ``datum_values=True``). Each row's value is −g, its
    calibrated gradient (FedBary eq. 10) negated: OpenDataVal's convention, where low values are detrimental
    points (its LAVA evaluator negates the same gradient). Labels may be class indices or one-hot rows (as an
    OpenDataVal ``DataFetcher`` gives them); tensors and arrays both work. ``result`` keeps the FedBary session
    (contributions, convergence of each client's potential).

    :func:`opendataval_evaluator` returns this class mixed into OpenDataVal's own ``DataEvaluator``.

    Two clients of 30 rows each; row r's value is −g of the same datum in FedBary's own result:

    >>> rng = np.random.default_rng(0)
    >>> y = np.arange(60) % 2
    >>> x, x_valid = rng.normal(size=(60, 2)) + 3.0 * y[:, None], rng.normal(size=(40, 2)) + 3.0 * y[:40, None]
    >>> evaluator = FedBaryDataValues(n_clients=2, config={"support_size": 20, "iterations": 5})
    >>> values = evaluator.input_data(x, y, x_valid, y[:40]).train_data_values().evaluate_data_values()
    >>> g = evaluator.result.datum_values
    >>> values.shape, bool(np.array_equal(values, -np.concatenate([g["client_0"], g["client_1"]])))
    ((60,), True)
    """

    def __init__(self, n_clients: int = 2, clients: Sequence[Any] | None = None,
                 config: FedBaryConfig | Mapping[str, Any] | None = None, seed: int = 0,
                 potential: Potential = "sinkhorn", *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if clients is None and int(n_clients) < 1:
            raise ValueError(f"n_clients must be ≥ 1, got {n_clients}")
        self.n_clients = int(n_clients)
        self.clients = None if clients is None else np.asarray(clients)
        self.config = as_config({} if config is None else config, FedBaryConfig)
        self.seed = int(seed)
        self.potential = potential
        self.result: FedBaryResult | None = None
        self._values: np.ndarray | None = None

    def input_data(self, x_train: Any, y_train: Any, x_valid: Any, y_valid: Any) -> "FedBaryDataValues":
        """Keep the training and validation data (OpenDataVal's ``DataEvaluator.input_data``)."""
        self.x_train, self.y_train, self.x_valid, self.y_valid = x_train, y_train, x_valid, y_valid
        return self

    def train_data_values(self, *args: Any, **kwargs: Any) -> "FedBaryDataValues":
        """Run FedBary over the clients the training rows form, Q = the validation set; keep each row's −g."""
        x, y = _features(self.x_train, "x_train"), _labels(self.y_train, "y_train")
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"y_train has {y.shape[0]} labels for {x.shape[0]} rows of x_train")
        if self.clients is not None:
            if self.clients.shape != (x.shape[0],):
                raise ValueError(f"clients must give one client per training row ({x.shape[0]}), got shape "
                                 f"{self.clients.shape}")
            groups = [np.flatnonzero(self.clients == c) for c in dict.fromkeys(self.clients.tolist())]
            names = [f"client_{c}" for c in dict.fromkeys(self.clients.tolist())]
        else:
            groups = [g for g in np.array_split(np.arange(x.shape[0]), self.n_clients) if g.size]
            names = [f"client_{k}" for k in range(len(groups))]
        datasets = [LabelledData(name, x[rows], y[rows]) for name, rows in zip(names, groups)]
        validation = LabelledData("server", _features(self.x_valid, "x_valid"), _labels(self.y_valid, "y_valid"))
        self.result = federated_valuation(datasets, self.config, validation=validation, seed=self.seed,
                                          datum_values=True, potential=self.potential)
        values = np.empty(x.shape[0])
        for name, rows in zip(names, groups):
            values[rows] = -np.asarray(self.result.datum_values[name])
        self._values = values
        return self

    def evaluate_data_values(self) -> np.ndarray:
        """Each training row's value, −g (low = detrimental), in the rows' order."""
        if self._values is None:
            raise RuntimeError("no data values yet: call input_data(...) and train_data_values() first")
        return self._values.copy()

    @property
    def data_values(self) -> np.ndarray:
        """The values of :meth:`evaluate_data_values` (OpenDataVal's cached attribute)."""
        return self.evaluate_data_values()


def _features(x: Any, name: str) -> np.ndarray:
    array = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x, dtype=np.float64)
    if array.ndim != 2:
        raise ValueError(f"{name} must be an (n, d) table of features, got shape {array.shape}")
    return array


def _labels(y: Any, name: str) -> np.ndarray:
    """Class indices from indices or one-hot rows (OpenDataVal's fetchers give one-hot labels)."""
    array = np.asarray(y.detach().cpu().numpy() if hasattr(y, "detach") else y)
    if array.ndim == 2:
        array = array.argmax(axis=1)
    if array.ndim != 1:
        raise ValueError(f"{name} must be n class labels or an (n, C) one-hot table, got shape {array.shape}")
    return array


def _opendataval_api() -> types.ModuleType:
    """``opendataval.dataval.api``, imported next to otfed's pins (see the module's docstring): ``geomloss.utils``
    pointed to geomloss 0.3's ``geomloss._legacy.utils`` where only that exists, and, where torchvision is not
    installed, an empty ``opendataval.dataloader.datasets.imagesets`` in place of the image data sets. ImportError,
    naming the cause, when OpenDataVal is not installed or still does not import."""
    if importlib.util.find_spec("opendataval") is None:
        raise ImportError("opendataval_evaluator needs OpenDataVal; its PyPI release 1.3.0 declares numpy<1.26, "
                          "pandas<2 and torch~=2.1, which otfed's pins exclude: pip install --no-deps --target "
                          ".venv/conformance -r requirements-conformance.txt and append that folder to sys.path "
                          "(FedBaryDataValues implements the same protocol without it)")
    try:
        import geomloss
    except ImportError:  # LAVA's import then fails as published: nothing to point
        geomloss = None
    if geomloss is not None and not hasattr(geomloss, "utils") and importlib.util.find_spec("geomloss.utils") is None:
        from geomloss._legacy import utils as legacy_utils   # geomloss 0.3's home of 0.2's geomloss.utils

        sys.modules["geomloss.utils"] = legacy_utils
        geomloss.utils = legacy_utils
    images = "opendataval.dataloader.datasets.imagesets"
    if importlib.util.find_spec("torchvision") is None and images not in sys.modules:
        sys.modules[images] = types.ModuleType(images, "OpenDataVal's image data sets: left out, torchvision is "
                                                       "not installed (otfed.federation.adapters)")
    try:
        from opendataval.dataval import api
    except (ImportError, RuntimeError, AttributeError) as exc:   # torchvision built for another torch: RuntimeError
        raise ImportError(f"OpenDataVal is installed but does not import next to otfed's pins: {exc!r}") from exc
    return api


@functools.cache
def _evaluator_class() -> type:
    """FedBaryDataValues mixed into OpenDataVal's ``DataEvaluator`` and ``ModelLessMixin``: one class per process,
    so that ``DataEvaluator.Evaluators["fedbaryevaluator"]`` (OpenDataVal's registry) names it once."""
    api = _opendataval_api()
    return type("FedBaryEvaluator", (FedBaryDataValues, api.DataEvaluator, api.ModelLessMixin),
                {"__doc__": FedBaryDataValues.__doc__, "__module__": __name__, "__qualname__": "FedBaryEvaluator",
                 "data_values": FedBaryDataValues.data_values})


def opendataval_evaluator(**kwargs: Any) -> Any:
    """A :class:`FedBaryDataValues` that IS an OpenDataVal ``DataEvaluator`` (and ``ModelLessMixin``: no
    prediction model), built on OpenDataVal's own classes so that its ``DataFetcher`` (``evaluator.train(fetcher)``)
    and experiments (``noisy_detection``, ``discover_corrupted_sample``, …) take it; ``kwargs`` go to
    :class:`FedBaryDataValues` (and ``random_state`` to OpenDataVal's ``DataEvaluator``). The class is made once
    per process and registered in OpenDataVal's ``DataEvaluator.Evaluators`` as ``"fedbaryevaluator"``.

    Raises ImportError naming the conflict when OpenDataVal is not importable; the module's docstring says how to
    install it beside otfed's pins and what the import accommodates.
    """
    return _evaluator_class()(**kwargs)
