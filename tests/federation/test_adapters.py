"""Adapters of FedBary's results (issue #34): pandas tables, pyDVL's ValuationResult, OpenDataVal's DataEvaluator
protocol. The truth each test checks against is independent of the adapter: the FedBary result's own arrays, NumPy
and SciPy statistics over the runs, and pyDVL's / OpenDataVal's own classes where they are importable (pip cannot
install either next to otfed's pins: pyDVL 0.10.0 declares numpy<2, OpenDataVal 1.3.0 numpy<1.26, pandas<2 and
torch~=2.1 — see otfed/federation/adapters.py)."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import scipy.stats

from otfed.federation.adapters import (FedBaryDataValues, contributions_frame, datum_values_frame,
                                       opendataval_evaluator, to_pydvl)
from otfed.federation.fedbary import FedBaryConfig, federated_valuation, valuation_spread
from otfed.ot.otdd import LabelledData

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


# ------------------------------------------------------------------------------------------------------ pyDVL

def test_to_pydvl_without_pydvl_names_the_conflict(monkeypatch, spread_result):
    monkeypatch.setitem(sys.modules, "pydvl", None)  # import pydvl → ImportError, whatever is installed
    with pytest.raises(ImportError, match=r"to_pydvl needs pyDVL .* declare numpy<2"):
        to_pydvl(spread_result)


def test_to_pydvl_round_trips_through_pydvl(spread_result):
    pytest.importorskip("pydvl.valuation.result", reason="pyDVL is not importable (pip: its numpy<2 conflicts)")
    from pydvl.valuation.result import ValuationResult

    converted = to_pydvl(spread_result)
    assert isinstance(converted, ValuationResult)
    runs = spread_result.spread.contributions
    order = np.argsort(converted.indices)
    np.testing.assert_allclose(converted.values[order], runs.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(converted.stderr[order], runs.std(axis=0, ddof=1) / np.sqrt(4), rtol=1e-9)
    assert [str(n) for n in converted.names[order]] == ["c0", "c1", "c2"]
    frame = converted.to_dataframe(column="fedbary")   # pyDVL's own table
    np.testing.assert_allclose(frame["fedbary"].to_numpy()[order], runs.mean(axis=0), rtol=1e-12)
    # pyDVL's ranking (highest value first) is FedBary's
    ranked = [str(item.name) for item in sorted(converted, key=lambda item: -item.value)]
    assert ranked == [spread_result.names[i] for i in np.argsort(-runs.mean(axis=0), kind="stable")]
    # pyDVL's sum of two results pools their samples: the mean over all 4 + 2 runs
    more = valuation_spread(_clients(), CONFIG, seeds=[4, 5])
    pooled = converted + to_pydvl(more)
    everything = np.vstack([runs, more.spread.contributions])
    np.testing.assert_allclose(pooled.values[np.argsort(pooled.indices)], everything.mean(axis=0), rtol=1e-9)
    assert (pooled.counts == 6).all()


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
    monkeypatch.setitem(sys.modules, "opendataval", None)
    with pytest.raises(ImportError, match=r"OpenDataVal; its PyPI release 1\.3\.0 declares numpy<1\.26"):
        opendataval_evaluator(config=CONFIG)


def test_opendataval_evaluator_is_an_opendataval_data_evaluator():
    pytest.importorskip("opendataval.dataval.api", reason="OpenDataVal is not importable (pip: its pins conflict)")
    from opendataval.dataval.api import DataEvaluator, ModelLessMixin

    x, y, xv, yv = _train_valid()
    evaluator = opendataval_evaluator(n_clients=3, config=CONFIG)
    assert isinstance(evaluator, DataEvaluator) and isinstance(evaluator, ModelLessMixin)
    assert DataEvaluator.Evaluators["fedbaryevaluator"] is type(evaluator)
    values = evaluator.input_data(x, y, xv, yv).train_data_values().evaluate_data_values()
    plain = FedBaryDataValues(n_clients=3, config=CONFIG).input_data(x, y, xv, yv).train_data_values()
    np.testing.assert_array_equal(values, plain.evaluate_data_values())


def test_the_module_examples_pass():
    import doctest

    import otfed.federation.adapters as adapters

    failed, attempted = doctest.testmod(adapters, optionflags=doctest.ELLIPSIS)
    assert attempted >= 8 and failed == 0
