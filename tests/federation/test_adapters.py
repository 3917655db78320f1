"""Adapters of FedBary's results (issue #34): pandas tables, pyDVL's ValuationResult, OpenDataVal's DataEvaluator
protocol. The truth each test checks against is independent of the adapter: the FedBary result's own arrays, NumPy
and SciPy statistics over the runs, and pyDVL's / OpenDataVal's own code — pyDVL's running moments fed the runs'
shares, OpenDataVal's DataFetcher, noise, experiments and LAVA evaluator.

pip cannot install pyDVL 0.10.0 (numpy<2) or OpenDataVal 1.3.0 (numpy<1.26, pandas<2, torch~=2.1) next to otfed's
pins, so ``make test`` installs them with ``--no-deps`` into a folder of their own, .venv/conformance
(requirements-conformance.txt), and sets OTFED_REQUIRE_CONFORMANCE=1: the ``side_install`` fixture appends that
folder to ``sys.path`` — at the end, so the locked packages win — for this module's tests only, and a library that
does not import there fails the test. Run without make (no OTFED_REQUIRE_CONFORMANCE), the tests that need a library
skip where it is missing.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import scipy.stats

import otfed.federation.adapters as adapters
from otfed.federation.adapters import (FedBaryDataValues, contributions_frame, datum_values_frame,
                                       opendataval_evaluator, to_pydvl)
from otfed.federation.fedbary import FedBaryConfig, federated_valuation, valuation_spread
from otfed.ot.otdd import LabelledData

SIDE_INSTALL = Path(os.environ.get("OTFED_CONFORMANCE", Path(__file__).resolve().parents[2] / ".venv" / "conformance"))
REQUIRED = os.environ.get("OTFED_REQUIRE_CONFORMANCE") == "1"   # set by `make test`: a missing library fails

pandas = pytest.importorskip("pandas")
CONFIG = FedBaryConfig(support_size=10, iterations=3)


def _clients(n: int = 30) -> list[LabelledData]:
    rng = np.random.default_rng(0)
    y = np.arange(n) % 2
    return [LabelledData(f"c{i}", rng.normal(size=(n, 2)) + 3.0 * y[:, None] + shift, y)
            for i, shift in enumerate([0.0, 0.5, 2.0])]


@pytest.fixture(scope="module")
def spread_result():
    return valuation_spread(_clients(), CONFIG, seeds=[0, 1, 2, 3])


def test_the_contributions_table_is_the_result_and_its_t_interval(spread_result):
    table = spread_result.to_dataframe()
    assert table.equals(contributions_frame(spread_result))
    assert table["client"].tolist() == ["c0", "c1", "c2"]
    np.testing.assert_array_equal(table["contribution"], spread_result.contributions)
    np.testing.assert_array_equal(table["distance"], spread_result.distances)
    runs = spread_result.spread.contributions                     # runs × clients
    assert (table["runs"] == 4).all()
    np.testing.assert_allclose(table["mean"], runs.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(table["std"], runs.std(axis=0, ddof=1), rtol=1e-12)
    half = scipy.stats.t.ppf(0.975, df=3) * runs.std(axis=0, ddof=1) / np.sqrt(4)   # 95 % Student-t, by hand
    np.testing.assert_allclose(table["ci_high"] - table["mean"], half, rtol=1e-9)
    np.testing.assert_allclose(table["mean"] - table["ci_low"], half, rtol=1e-9)


def test_one_run_has_no_spread_columns():
    result = federated_valuation(_clients(), CONFIG, seed=0)
    assert result.to_dataframe().columns.tolist() == ["client", "contribution", "distance"]
    assert result.to_dataframe()["contribution"].sum() == pytest.approx(100.0)


def test_the_datum_values_table_holds_every_datum_in_order():
    result = federated_valuation(_clients(), CONFIG, seed=0, datum_values=True)
    table = datum_values_frame(result)
    assert len(table) == 90
    for name in result.names:
        rows = table[table["client"] == name]
        np.testing.assert_array_equal(rows["row"], np.arange(30))
        np.testing.assert_array_equal(rows["value"], result.datum_values[name])
    with pytest.raises(ValueError, match=r"no datum values: run federated_valuation\(\.\.\., datum_values=True\)"):
        datum_values_frame(federated_valuation(_clients(), CONFIG, seed=0))


# ------------------------------------------------------------------------------------------- the side install

@pytest.fixture(scope="module")
def side_install() -> Path:
    """.venv/conformance at the end of sys.path while this module's tests run (the locked packages come first)."""
    added = SIDE_INSTALL.is_dir() and str(SIDE_INSTALL) not in sys.path
    if added:
        sys.path.append(str(SIDE_INSTALL))
        importlib.invalidate_caches()
    yield SIDE_INSTALL
    if added:
        sys.path.remove(str(SIDE_INSTALL))


def _library(load: Callable[[], Any], what: str) -> Any:
    """``load()`` (an import): its ImportError skips the test — as pytest.importorskip does — or, under
    ``make test`` (OTFED_REQUIRE_CONFORMANCE=1), fails it."""
    try:
        return load()
    except ImportError as exc:
        message = (f"{what} does not import from {SIDE_INSTALL} ({exc!r}); build it with `make conformance` "
                   f"(pip install --no-deps --target .venv/conformance -r requirements-conformance.txt)")
        if REQUIRED:
            pytest.fail(message)
        pytest.skip(message)


def _block(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    """Make ``package`` and every submodule already imported unimportable for this test, whatever is installed."""
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")] + [package]:
        monkeypatch.setitem(sys.modules, name, None)


# ------------------------------------------------------------------------------------------------------ pyDVL

def test_to_pydvl_without_pydvl_names_the_conflict(monkeypatch, spread_result):
    _block(monkeypatch, "pydvl")
    with pytest.raises(ImportError, match=r"to_pydvl needs pyDVL .* declare numpy<2.*--no-deps --target"):
        to_pydvl(spread_result)


def _pydvl_accumulated(result_runs: np.ndarray, names: list[str]) -> Any:
    """What pyDVL's own samplers build from per-run values: one ValueUpdate per run and client, fed to its
    LogResultUpdater (running mean and unbiased variance), starting from ValuationResult.zeros."""
    from pydvl.valuation.result import LogResultUpdater, ValuationResult
    from pydvl.valuation.types import ValueUpdate

    updater = LogResultUpdater(ValuationResult.zeros(algorithm="otfed.FedBary", indices=np.arange(len(names)),
                                                     data_names=np.asarray(names)))
    for run in result_runs:
        for index, share in enumerate(run):
            updater.process(ValueUpdate(index, float(np.log(abs(share))), int(np.sign(share))))
    return updater.result


def test_to_pydvl_is_what_pydvl_accumulates_from_the_runs(side_install, spread_result):
    result_module = _library(lambda: importlib.import_module("pydvl.valuation.result"), "pyDVL")
    converted = to_pydvl(spread_result)
    assert isinstance(converted, result_module.ValuationResult)
    runs = spread_result.spread.contributions                     # runs × clients
    truth = _pydvl_accumulated(runs, spread_result.names)
    np.testing.assert_array_equal(converted.indices, truth.indices)
    np.testing.assert_allclose(converted.values, truth.values, rtol=1e-12)
    np.testing.assert_allclose(converted.variances, truth.variances, rtol=1e-9)
    np.testing.assert_array_equal(converted.counts, truth.counts)
    np.testing.assert_allclose(converted.stderr, runs.std(axis=0, ddof=1) / np.sqrt(4), rtol=1e-9)
    assert [str(n) for n in converted.names] == ["c0", "c1", "c2"] == [str(n) for n in truth.names]
    assert converted.status == result_module.Status.Converged
    frame = converted.to_dataframe(column="fedbary")   # pyDVL's own table
    np.testing.assert_allclose(frame["fedbary"].to_numpy(), runs.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(frame["fedbary_variances"].to_numpy(), runs.var(axis=0, ddof=1), rtol=1e-9)
    # pyDVL's ranking (its sort, highest value first) is FedBary's
    ranked = [str(item.name) for item in converted.sort(reverse=True)]
    assert ranked == [spread_result.names[i] for i in np.argsort(-runs.mean(axis=0), kind="stable")]


def test_pydvl_sums_pool_the_runs(side_install, spread_result):
    _library(lambda: importlib.import_module("pydvl.valuation.result"), "pyDVL")
    more = valuation_spread(_clients(), CONFIG, seeds=[4, 5])
    pooled = to_pydvl(spread_result) + to_pydvl(more)
    everything = np.vstack([spread_result.spread.contributions, more.spread.contributions])
    np.testing.assert_allclose(pooled.values, everything.mean(axis=0), rtol=1e-9)
    assert (pooled.counts == 6).all()
    single = to_pydvl(federated_valuation(_clients(), CONFIG, seed=7))   # one run: its shares, variance 0, count 1
    assert (single.counts == 1).all() and (single.variances == 0).all()
    np.testing.assert_allclose((to_pydvl(spread_result) + single).values,
                               (4 * spread_result.spread.mean + single.values) / 5, rtol=1e-9)


# ------------------------------------------------------------------------------------------------ OpenDataVal

def _train_valid():
    rng = np.random.default_rng(3)
    y = np.arange(60) % 2
    return rng.normal(size=(60, 2)) + 3.0 * y[:, None], y, rng.normal(size=(40, 2)) + 3.0 * y[:40, None], y[:40]


def test_fedbary_data_values_are_minus_fedbary_datum_values_in_row_order():
    x, y, xv, yv = _train_valid()
    owners = np.array(["b", "a", "c"] * 20)  # interleaved rows: each client's rows are scattered
    evaluator = FedBaryDataValues(clients=owners, config=CONFIG, seed=2)
    values = evaluator.input_data(x, y, xv, yv).train_data_values().evaluate_data_values()
    expected = federated_valuation([LabelledData(f"client_{c}", x[owners == c], y[owners == c]) for c in "bac"],
                                   CONFIG, validation=LabelledData("server", xv, yv), seed=2, datum_values=True)
    for c in "abc":
        np.testing.assert_array_equal(values[owners == c], -expected.datum_values[f"client_{c}"])
    np.testing.assert_array_equal(evaluator.data_values, values)


def test_one_hot_tensor_labels_as_a_fetcher_gives_them_are_the_same_values():
    torch = pytest.importorskip("torch")
    x, y, xv, yv = _train_valid()
    plain = FedBaryDataValues(n_clients=3, config=CONFIG).input_data(x, y, xv, yv).train_data_values()
    onehot = np.eye(2)[y]
    tensors = FedBaryDataValues(n_clients=3, config=CONFIG).input_data(
        torch.tensor(x), torch.tensor(onehot), torch.tensor(xv), torch.tensor(np.eye(2)[yv])).train_data_values()
    np.testing.assert_array_equal(plain.evaluate_data_values(), tensors.evaluate_data_values())


def test_the_evaluator_refuses_what_it_cannot_value():
    x, y, xv, yv = _train_valid()
    with pytest.raises(RuntimeError, match="call input_data"):
        FedBaryDataValues().evaluate_data_values()
    with pytest.raises(ValueError, match=r"clients must give one client per training row \(60\)"):
        FedBaryDataValues(clients=[0, 1], config=CONFIG).input_data(x, y, xv, yv).train_data_values()
    with pytest.raises(ValueError, match=r"y_train has 59 labels for 60 rows"):
        FedBaryDataValues(config=CONFIG).input_data(x, y[:-1], xv, yv).train_data_values()
    with pytest.raises(ValueError, match="n_clients must be ≥ 1"):
        FedBaryDataValues(n_clients=0)


def test_opendataval_evaluator_without_opendataval_names_the_conflict(monkeypatch):
    _block(monkeypatch, "opendataval")
    monkeypatch.setattr(adapters, "_evaluator_class", adapters._evaluator_class.__wrapped__)   # not the cached class
    with pytest.raises(ImportError, match=r"OpenDataVal; its PyPI release 1\.3\.0 declares numpy<1\.26.*--no-deps"):
        opendataval_evaluator(config=CONFIG)


def _opendataval(side_install: Path) -> Any:
    """OpenDataVal's ``DataEvaluator`` module, imported as the adapter imports it (the module's docstring)."""
    return _library(adapters._opendataval_api, "OpenDataVal")


def test_opendataval_evaluator_is_an_opendataval_data_evaluator(side_install):
    api = _opendataval(side_install)
    x, y, xv, yv = _train_valid()
    evaluator = opendataval_evaluator(n_clients=3, config=CONFIG)
    assert isinstance(evaluator, api.DataEvaluator) and isinstance(evaluator, api.ModelLessMixin)
    assert api.DataEvaluator.Evaluators["fedbaryevaluator"] is type(evaluator) is type(opendataval_evaluator())
    assert repr(evaluator).startswith("FedBaryEvaluator(n_clients=3")   # OpenDataVal's ReprMixin
    values = evaluator.input_data(x, y, xv, yv).train_data_values().evaluate_data_values()
    plain = FedBaryDataValues(n_clients=3, config=CONFIG).input_data(x, y, xv, yv).train_data_values()
    np.testing.assert_array_equal(values, plain.evaluate_data_values())
    np.testing.assert_array_equal(evaluator.data_values, values)


def test_opendataval_runs_fedbary_end_to_end(side_install):
    """OpenDataVal's own pipeline — a DataFetcher over presplit data, its label noise (mix_labels), DataEvaluator.train
    (setup → input_fetcher → train_data_values), its noisy_detection experiment — with FedBary as the evaluator.
    Truth: FedBary run directly on the fetcher's tensors (−g, FedBary eq. 10, row by row), and OpenDataVal's own
    LAVA evaluator on the same fetcher, the method FedBary's calibrated gradient extends."""
    _opendataval(side_install)
    from opendataval.dataloader import DataFetcher, mix_labels
    from opendataval.dataval import LavaEvaluator
    from opendataval.experiment.exper_methods import noisy_detection

    rng = np.random.default_rng(0)

    def sample(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.arange(n) % 3
        return rng.normal(size=(n, 4)) + 3.0 * np.eye(3, 4)[y], np.eye(3)[y]   # one-hot, as OpenDataVal's sets

    (xt, yt), (xv, yv), (xs, ys) = sample(90), sample(60), sample(30)
    fetcher = DataFetcher.from_data_splits(xt, yt, xv, yv, xs, ys, one_hot=True, random_state=0)
    fetcher = fetcher.noisify(mix_labels, noise_rate=0.2)
    noisy = np.zeros(90, dtype=bool)
    noisy[fetcher.noisy_train_indices] = True
    assert noisy.sum() == 18

    evaluator = opendataval_evaluator(n_clients=3, config=CONFIG).train(fetcher)
    values = evaluator.data_values
    x_train, y_train, x_valid, y_valid, *_ = fetcher.datapoints          # float32 tensors, one-hot labels
    x, y = x_train.numpy().astype(np.float64), y_train.numpy().argmax(axis=1)
    blocks = np.array_split(np.arange(90), 3)
    direct = federated_valuation([LabelledData(f"client_{k}", x[rows], y[rows]) for k, rows in enumerate(blocks)],
                                 CONFIG, validation=LabelledData("server", x_valid.numpy().astype(np.float64),
                                                                 y_valid.numpy().argmax(axis=1)),
                                 seed=0, datum_values=True)
    np.testing.assert_array_equal(values, -np.concatenate([direct.datum_values[f"client_{k}"] for k in range(3)]))

    f1 = noisy_detection(evaluator, fetcher)["kmeans_f1"]
    assert 0.0 < f1 <= 1.0
    auc = scipy.stats.mannwhitneyu(-values[noisy], -values[~noisy]).statistic / (18 * 72)   # low value = noisy
    assert auc > 0.6, f"FedBary's values rank the mixed labels at AUC {auc:.3f}"
    lava = LavaEvaluator(random_state=0).train(fetcher).data_values   # geomloss 0.3's functions under 0.2's name
    rho = scipy.stats.spearmanr(values, lava).statistic
    assert rho > 0.4, f"FedBary and OpenDataVal's LAVA rank the rows alike only at Spearman {rho:.2f}"


def test_the_module_examples_pass():
    import doctest

    import otfed.federation.adapters as adapters

    failed, attempted = doctest.testmod(adapters, optionflags=doctest.ELLIPSIS)
    assert attempted >= 8 and failed == 0
