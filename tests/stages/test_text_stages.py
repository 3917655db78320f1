"""The KNOT text track end to end on tiny params (real embedded data, a few dozen texts, a one-layer model):
``partition`` → ``train_teachers`` → ``estimate_bias`` → ``distill`` (``TEXT_TRACK``). Checked against independent truths: the table 1
sizes equal the partition files' row counts, the teachers' transfer predictions in the message file equal
what the saved teacher predicts, each bias row sums to 1 and equals a recount of argmax predictions on the
same random texts (and the ablation's soft bias their mean probability row), table rows are recomputed from the saved predictions, the eight variants share metric
names in MLflow, the server side never loads a teacher model or sees a client's training text, and a second run
in another folder writes the same bytes (no wall time in a committed table)."""
from __future__ import annotations

import json
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch

import stages.distill
from flows.stage import run_stage
from otfed.data.text import load_text_federation
from otfed.distill.bias import random_texts
from otfed.federation.knot import BIAS, SOFT_BIAS, load_messages
from otfed.label_space import LabelSpace
from otfed.metrics import macro_f1, semantic_distance
from otfed.models import TextClassifier
from otfed.models.tokenizer import vocabulary
from stages import layout
from stages.params import validate_params
from tests.stages.conftest import TEXT_TRACK, assert_reproducible, run_track, tiny_params

pytestmark = pytest.mark.slow  # every test reads the text track run (four stages), some run it again

TINY_MODEL = {"kind": "bert", "layers": 1, "hidden": 16, "heads": 2, "intermediate": 32, "max_length": 24,
              "vocab_size": 300}


def text_params(root: Path) -> dict:
    """The text track only: no feature federations, and a feature group the text stages must not read."""
    params = tiny_params(root)
    del params["partition"]["federations"]
    params["fed_distance"] = {"toy": {"iterations": "not an int"}, "no_such_key": 1}
    caps = {"max_train": 40, "max_eval": 20, "max_transfer": 30, "audit": 10}
    params["partition"]["text"] = {
        "tasks": {"sa": {"dataset": "amazon_categories", "locals": ["cell_phones", "digital_music"],
                         "global_party": "baby", "transfer": None, "train_sizes": {"baby": 20}, **caps}},
    }
    params["train_teachers"] = {
        "tasks": ["sa"], "model": TINY_MODEL,
        "party_models": {"sa.digital_music": {**TINY_MODEL, "kind": "distilbert"}},
        "training": {"epochs": 2, "batch_size": 16, "lr": 0.003, "patience": 1},
    }
    params["estimate_bias"] = {"n_texts": 24, "text_length": 30, "batch_size": 8}
    # gate off: tiny teachers fail it, and these tests need students (test_the_gate_* runs it on)
    params["distill"] = {"eps": 0.05, "epochs": 2, "patience": 1, "lr_grid": [0.01, 0.03], "batch_size": 16,
                         "seeds": 2, "gate": False}
    return params


@pytest.fixture(scope="module")
def text_run(tmp_path_factory: pytest.TempPathFactory, migrated_mlflow_db: Path):
    """Run the four stages once (module scope: ~20 s) and hand the tests the params and outputs."""
    import shutil

    root = tmp_path_factory.mktemp("text")
    db = root / "mlruns.db"
    shutil.copy(migrated_mlflow_db, db)
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    mp.chdir(root)
    loaded: list[str] = []
    original_load = TextClassifier.load.__func__

    def recording_load(cls, directory, device=None):
        loaded.append(str(directory))
        return original_load(cls, directory, device=device)

    params = text_params(root)
    threads = torch.get_num_threads()
    try:
        def view(stage: str):  # what `python -m flows.stage <stage>` validates: its own groups only
            return validate_params(params, stage=stage)

        run_stage("partition", view("partition"))
        teachers = run_stage("train_teachers", view("train_teachers"))
        bias = run_stage("estimate_bias", view("estimate_bias"))
        with pytest.MonkeyPatch.context() as spy:
            spy.setattr(TextClassifier, "load", classmethod(recording_load))
            metrics = run_stage("distill", view("distill"))
        yield {"root": root, "params": params, "teachers": teachers, "bias": bias, "metrics": metrics,
               "distill_loaded": list(loaded), "uri": f"sqlite:///{db}"}
    finally:
        mp.undo()
        torch.set_num_threads(threads)


def test_table1_sizes_match_the_partition_files(text_run) -> None:
    root = text_run["root"]
    table = pd.read_csv(root / layout.TEACHER_REPORTS / "teachers.csv")
    parties = pd.read_csv(root / layout.TEXT_PARTITIONS / "sa" / "parties.csv.gz")
    for row in table.itertuples():
        own = parties[parties.party == row.party]
        assert row.n_train == (own.split == "train").sum()
        assert row.n_test == (own.split == "test").sum()
        # the majority baseline: the most frequent training label predicted for every test text
        test_labels = own[own.split == "test"].label.to_numpy()
        majority = np.bincount(own[own.split == "train"].label.to_numpy()).argmax()
        assert row.majority_score == pytest.approx(macro_f1(test_labels, np.full(len(test_labels), majority),
                                                            present_only=True))
    assert table.set_index("party").n_train.to_dict() == {"cell_phones": 40, "digital_music": 40, "baby": 20}
    assert set(table.model) == {"bert", "distilbert"}
    assert set(table.role) == {"local", "global"}


def test_messages_are_the_saved_teachers_predictions(text_run) -> None:
    root = text_run["root"]
    fed = load_text_federation(root / layout.TEXT_PARTITIONS / "sa")
    messages = {(m.kind, m.sender): m for m in load_messages(root / layout.TEXT_MESSAGES / "sa.npz")}
    for party in fed.parties:
        clf = TextClassifier.load(root / layout.TEXT_MODELS / "sa" / party.name)
        np.testing.assert_allclose(messages[("transfer_predictions", party.name)].probabilities,
                                   clf.predict_proba(list(fed.transfer_texts)), atol=1e-6)
        assert messages[("dataset_size", party.name)].value == len(party.train)


def test_bias_is_the_argmax_frequency_on_random_texts(text_run) -> None:
    root, params = text_run["root"], text_run["params"]
    table = pd.read_csv(root / layout.BIAS_REPORTS / "bias.csv")
    labels = LabelSpace.for_task("sa").labels
    np.testing.assert_allclose(table[list(labels)].sum(axis=1), 1.0)
    # recount one teacher independently: same seed → same random texts
    eb = params["estimate_bias"]
    clf = TextClassifier.load(root / layout.TEXT_MODELS / "sa" / "cell_phones")
    texts = random_texts(vocabulary(clf.tokenizer), eb["n_texts"], eb["text_length"], rng=params["run"]["seed"])
    predictions = clf.predict_proba(texts)
    counts = np.bincount(predictions.argmax(1), minlength=len(labels)) / len(texts)
    row = table[table.party == "cell_phones"].iloc[0]
    np.testing.assert_allclose(row[list(labels)].to_numpy(dtype=float), counts)
    # the ablation's soft bias, from the same pass: the mean of the same predictions
    soft_table = pd.read_csv(root / layout.BIAS_REPORTS / "bias_soft.csv")
    assert list(soft_table.columns) == [*table.columns, "l2_to_hard"]
    soft_row = soft_table[soft_table.party == "cell_phones"].iloc[0]
    np.testing.assert_allclose(soft_row[list(labels)].to_numpy(dtype=float), predictions.mean(axis=0), atol=1e-8)
    assert soft_row.l2_to_hard == pytest.approx(np.linalg.norm(predictions.mean(axis=0) - counts), abs=1e-8)
    # the bias messages the server reads (data/text_bias/<task>.npz) are the tables' rows: one per party and kind
    received = load_messages(root / layout.TEXT_BIAS / "sa.npz")
    assert sorted(m.kind for m in received) == sorted([BIAS, SOFT_BIAS] * len(table))
    for kind, rows in ((BIAS, table), (SOFT_BIAS, soft_table)):
        sent = {m.sender: m.histogram for m in received if m.kind == kind}
        shares = rows.set_index("party")[list(labels)]
        assert set(sent) == set(shares.index)
        for party, histogram in sent.items():
            np.testing.assert_allclose(histogram, shares.loc[party].to_numpy(dtype=float), atol=1e-9)
            assert histogram.sum() == pytest.approx(1.0, abs=1e-12)


def test_tables_are_recomputed_from_saved_predictions(text_run) -> None:
    root = text_run["root"]
    results = pd.read_csv(root / layout.DISTILL_REPORTS / "results.csv")
    expected = {f"{loss}-{w}" for loss in ("Sinkhorn", "Entropy") for w in "ADUE"} | {
        "Sinkhorn-E-onehot", "Sinkhorn-mixture-A", "Sinkhorn-mixture-E", "Sinkhorn-E-soft", "Entropy-E-soft",
        "global (no distillation)"}
    assert set(results.variant) == expected
    assert set(results.test_set) == {"cell_phones", "digital_music", "baby", "ALL"}
    assert sorted(set(results.seed)) == [0, 1] and len(results[results.variant == "Sinkhorn-E"]) == 2 * 4
    space = LabelSpace.for_task("sa")
    first = results[results.seed == 0]  # the saved predictions are the first seed's
    with np.load(root / layout.DISTILL_REPORTS / "predictions_sa.npz") as saved:
        for row in first[first.variant.isin(["Sinkhorn-E", "Entropy-A"])].itertuples():
            probs, labels = saved[f"{row.variant}|{row.test_set}"], saved[f"labels|{row.test_set}"]
            assert row.score == pytest.approx(macro_f1(labels, probs, present_only=True))
            assert row.semantic_distance == pytest.approx(semantic_distance(probs, labels, space))
    table = pd.read_csv(root / layout.DISTILL_REPORTS / "table_sa.csv")
    assert list(table.columns[:5]) == ["variant", "cell_phones score", "cell_phones score ±", "cell_phones SD",
                                       "cell_phones SD ±"]
    # the table is the mean over the two seeds; the claims are their paired differences
    mean = results[(results.variant == "Entropy-D") & (results.test_set == "ALL")].score.mean()
    assert table.set_index("variant").loc["Entropy-D", "ALL score"] == pytest.approx(mean, abs=1e-6)
    claims = pd.read_csv(root / layout.DISTILL_REPORTS / "claims.csv")
    one = claims[(claims.claim == "Sinkhorn-A vs Entropy-A") & (claims.metric == "score")
                 & (claims.test_set == "ALL")].iloc[0]
    per_seed = results[results.test_set == "ALL"].pivot_table(index="seed", columns="variant", values="score")
    assert one.mean_difference == pytest.approx((per_seed["Sinkhorn-A"] - per_seed["Entropy-A"]).mean(), abs=1e-6)
    # 10 of the papers' claims, 1 one-hot, 4 mixture and 4 soft-bias comparisons × (score, SD)
    assert claims[claims.test_set == "ALL"].arm.value_counts().to_dict() == {
        "replication": 20, "mixture": 8, "soft_bias": 8, "one_hot": 2, "distillation": 16}
    # the declared family is the ALL rows: Holm over their paired-t p-values (recomputed here by hand), the rest
    # exploratory
    family = claims[claims.test_set == "ALL"]
    p_sorted = np.sort(family.p_value.to_numpy())
    holm = np.maximum.accumulate(np.minimum(1.0, (len(p_sorted) - np.arange(len(p_sorted))) * p_sorted))
    np.testing.assert_allclose(np.sort(family.p_holm.to_numpy()), holm, rtol=1e-12)
    assert claims[claims.test_set != "ALL"].p_holm.isna().all()
    assert set(claims[claims.test_set != "ALL"].adjusted_verdict) == {"exploratory"}
    assert set(family.adjusted_verdict) <= {"replicates", "reversed", "undecided", "uninformative", "first better",
                                            "second better"}
    # a comparison is "uninformative" exactly when a student in it does not beat its best constant
    summary = pd.read_csv(root / layout.DISTILL_REPORTS / "summary.csv").set_index(["test_set", "variant"])
    for c in claims.itertuples():
        beats = summary.loc[(c.test_set, c.better), "sd_skill"] > 0 and summary.loc[(c.test_set, c.baseline),
                                                                                    "sd_skill"] > 0
        assert (c.verdict == "uninformative") == (not beats)
        assert c.verdict == "uninformative" or c.verdict == c.statistical_verdict or c.arm != "replication"
    # the diagnostics beside every score: SD skill against the best constant on the same test set
    all_rows = results[results.test_set == "ALL"]
    labels_all = np.load(root / layout.DISTILL_REPORTS / "predictions_sa.npz")["labels|ALL"]
    present = np.unique(labels_all)
    best = min(np.mean([abs(m - (y + 1)) for y in present]) for m in np.linspace(1, 5, 4001))
    assert all_rows.sd_constant.to_numpy() == pytest.approx(best, abs=1e-3)
    np.testing.assert_allclose(all_rows.sd_skill, 1 - all_rows.semantic_distance / all_rows.sd_constant, atol=1e-9)
    # every student kept the epoch of its lowest held-out loss, with one learning rate per variant
    history = pd.read_csv(root / layout.DISTILL_REPORTS / "history.csv")
    for (variant, seed), runs in history.groupby(["variant", "seed"]):
        kept = runs[runs.chosen & runs.best]
        assert len(kept) == 1 and kept.holdout_loss.iloc[0] == runs[runs.chosen].holdout_loss.min()
        row = results[(results.variant == variant) & (results.seed == seed)].iloc[0]
        assert row.lr == kept.lr.iloc[0] and row.epochs == kept.epoch.iloc[0]
    assert history[history.seed == 1].lr.nunique() == 1  # later seeds reuse the first seed's choice
    gate = pd.read_csv(root / layout.DISTILL_REPORTS / "gate.csv")
    assert list(gate.teacher) == ["cell_phones", "digital_music", "baby"] and (gate.n == 10).all()
    for name in ("expected_label_sa.png", "expected_vs_true_sa.png", "claims.png", "sinkhorn_vs_entropy.png"):
        assert (root / layout.DISTILL_REPORTS / name).stat().st_size > 0


def test_variants_line_up_in_mlflow(text_run) -> None:
    client = mlflow.MlflowClient(tracking_uri=text_run["uri"])
    exp_ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(exp_ids, filter_string="tags.task = 'sa'")
    variant_runs = [r for r in runs if r.data.tags.get("arm")]
    assert len(variant_runs) == 13
    names = {frozenset(r.data.metrics) for r in variant_runs}
    assert len(names) == 1 and {"ALL.semantic_distance", "ALL.score_ci95", "seed_score"} <= next(iter(names))
    history = client.get_metric_history(variant_runs[0].info.run_id, "seed_score")
    assert sorted(m.step for m in history) == [0, 1]  # one value per seed
    parents = client.search_runs(exp_ids, filter_string="tags.stage = 'distill'")
    run_id = parents[0].info.run_id
    folders = [a.path for a in client.list_artifacts(run_id, "reports") if a.is_dir]
    logged = {a.path.split("/")[-1] for d in folders for a in client.list_artifacts(run_id, d)}
    assert {"table_sa.csv", "table_sa.md", "results.csv", "claims.csv", "expected_label_sa.png",
            "sinkhorn_vs_entropy.png", "claims.png"} <= logged


def test_server_side_never_touches_client_models_or_training_texts(text_run) -> None:
    """Privacy (KNOT §3): the distill stage loads only the global model; teacher knowledge arrives as
    messages. The function that trains a student is never handed a client's training text."""
    root = text_run["root"]
    loaded = {Path(d).name for d in text_run["distill_loaded"]}
    assert loaded == {"baby"}
    fed = load_text_federation(root / layout.TEXT_PARTITIONS / "sa")
    captured = []

    def spy(**kwargs):
        captured.append(kwargs)
        raise RuntimeError("stop after capture")

    with pytest.raises(RuntimeError, match="stop after capture"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(stages.distill, "distill_variant", spy)
            mp.chdir(root)
            mp.setenv("MLFLOW_TRACKING_URI", text_run["uri"])
            run_stage("distill", validate_params(text_params(root), stage="distill"))
    train_texts = {t for p in fed.locals for t in p.train.texts}
    blob = json.dumps([{k: v for k, v in c.items() if k not in {"ensemble", "label_space"}}
                       for c in captured], default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    assert not any(t in blob for t in train_texts)
    assert type(captured[0]["ensemble"]).__name__ == "TeacherEnsemble"


def test_the_gate_stops_a_task_whose_teachers_cannot_be_read(text_run, tmp_path: Path) -> None:
    """With the gate on and a threshold no teacher reaches, the task is reported as "cannot test here": the gate
    table gives every teacher's Spearman on the audit slice (recomputed here), and no student is trained."""
    import shutil
    from scipy.stats import spearmanr

    root = text_run["root"]
    for folder in (layout.TEXT_PARTITIONS, layout.TEXT_MESSAGES, layout.TEXT_BIAS, layout.TEXT_MODELS):
        shutil.copytree(root / folder, tmp_path / folder)
    params = text_params(tmp_path)
    params["distill"].update(gate=True, gate_threshold=1.0)
    called = []
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        mp.setenv("MLFLOW_TRACKING_URI", text_run["uri"])
        mp.setattr(stages.distill, "distill_variant", lambda **kw: called.append(kw))
        metrics = run_stage("distill", validate_params(params, stage="distill"))
    assert not called and metrics["sa"]["testable"] == 0
    gate = pd.read_csv(tmp_path / layout.DISTILL_REPORTS / "gate.csv")
    fed = load_text_federation(tmp_path / layout.TEXT_PARTITIONS / "sa")
    coords = LabelSpace.for_task("sa").coordinates.numpy()[:, 0]
    for m in load_messages(tmp_path / layout.TEXT_MESSAGES / "sa.npz"):
        if m.kind == "transfer_predictions":
            expected = spearmanr(m.probabilities[fed.audit_index] @ coords, coords[fed.audit_labels]).statistic
            row = gate[gate.teacher == m.sender].iloc[0]
            assert row.informativeness == pytest.approx(expected, nan_ok=True) and not row.passes
    assert set(gate.task_verdict) == {"cannot test here"} and "Spearman ≥ 1.0" in gate.reason.iloc[0]
    results = pd.read_csv(tmp_path / layout.DISTILL_REPORTS / "results.csv")
    assert set(results.variant) == {"global (no distillation)"}
    assert not (tmp_path / layout.DISTILL_REPORTS / "table_sa.csv").exists()


def test_text_track_outputs_are_byte_reproducible(text_run, tmp_path: Path, migrated_mlflow_db: Path) -> None:
    """The text track again, in another folder: the same bytes in every output folder of every stage (reports,
    models, messages), and the wall times of table 1 and the histories in MLflow only."""
    again = run_track(tmp_path, migrated_mlflow_db, text_params(tmp_path), TEXT_TRACK)
    for name in TEXT_TRACK:
        assert_reproducible(name, text_run["root"], again["root"])
    client = mlflow.MlflowClient(tracking_uri=again["uri"])
    run = client.search_runs([client.get_experiment_by_name("otfed").experiment_id], "tags.stage = 'train_teachers'")[0]
    full = pd.read_csv(client.download_artifacts(run.info.run_id, "timings/teachers.csv", str(tmp_path / "dl")))
    committed = pd.read_csv(tmp_path / layout.TEACHER_REPORTS / "teachers.csv")
    assert list(full.columns) == list(committed.columns) + ["seconds"] and (full.seconds > 0).all()
