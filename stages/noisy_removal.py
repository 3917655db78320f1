"""Stage ``noisy_removal`` — FedBary table 4 (§11.4 "Boost FL Performance"): clients drop what FedBary flags.

5 clients with planted noise; the server holds a validation set (FedBary's target Q) and a test set.
Each client computes its datum values locally (calibrated gradients against η_{Q_i}, eq. 10) and drops data
by the paper's rule (g > 0), by a budget the server picks on its validation set, or by a threshold calibrated on
clean server data for a stated false-positive rate α (a second session, :func:`~otfed.federation.fedbary.calibrated_detection`);
FedAvg is trained on all data and on what is kept — with oracle and random removal for reference. One job per (noisy federation,
seed); the report gives mean ± 95% CI over the seeds.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Sequence

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from otfed.data.parties import FeatureProjection, client_sets, n_classes_of, server_split
from otfed.data.store import load_federation
from otfed.device import stage_device, threads_for
from otfed.errors import ConfigError
from otfed.federation.fedbary import FedBaryConfig, calibrated_detection, federated_valuation
from otfed.figures import valuation as figs
from otfed.fl import FedAvgConfig, evaluate, fedavg_state
from otfed.metrics import mean_confidence_interval
from otfed.ot.otdd import LabelledData
from otfed.valuation.calibrated import budget_removal, flag_noisy, flagged_removal, most_suspicious, random_removal
from otfed.valuation.detection import detection_auc
from stages import layout
from stages.params import server_split_federation
from stages.stage import Job, Report, Results, Stage

if TYPE_CHECKING:
    from stages.params import Params

# the folders this stage writes (declared in stages/layout.py); the first holds its reports and metrics.json
OUTPUTS = (layout.REMOVAL_REPORTS,)


# ------------------------------------------------------------------------------------------ params
class NoisyRemovalParams(FeatureProjection):
    """Stage ``noisy_removal`` (table 4): clients drop what FedBary flags; FedAvg before vs after."""

    federations: list[str] = Field(["fmnist_label_noise", "fmnist_feature_noise"], min_length=1)
    validation_samples: int = Field(500, ge=10, description="Server validation = first rows of the test split; "
                                    "the rest is the test set.")
    max_remove_fraction: float = Field(1.0, gt=0.0, le=1.0,
                                       description="Cap on the share of a client's data the g > 0 rule removes.")
    budgets: list[float] = Field([0.0, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3], min_length=1,
                                 description="Candidate shares of its data every client drops (largest g first); "
                                 "the server keeps the one whose FedAvg scores best on its validation set.")
    alpha: float | None = Field(0.05, gt=0.0, lt=1.0, description="Calibrated rule: the targeted false-positive rate "
                                "per clean datum (split-conformal threshold on the calibration part of the validation "
                                "set); null: no calibrated rule (a validation set too small to split).")
    calibration_fraction: float = Field(0.5, gt=0.0, lt=1.0, description="Calibrated rule: the validation set's "
                                        "share (every class) that calibrates the threshold; the rest is Q.")
    seeds: int = Field(3, ge=1, le=100, description="Repeats with seeds seed … seed+seeds−1 (FedBary's draws, FedAvg's "
                       "initialisation, the random removal): accuracies as mean ± 95% CI.")
    fedbary: FedBaryConfig = FedBaryConfig()
    fedavg: FedAvgConfig = FedAvgConfig(rounds=20)

    @field_validator("budgets")
    @classmethod
    def _budgets(cls, v: list[float]) -> list[float]:
        if any(not 0.0 <= b < 1.0 for b in v):
            raise ValueError("budgets must lie in [0, 1)")
        if len(set(v)) != len(v):
            raise ValueError("budgets must be distinct")
        return sorted(v)


def check(p: Params) -> None:
    """The federations exist, have a server test split and more test rows than ``validation_samples``."""
    nr = p.noisy_removal
    for i, name in enumerate(nr.federations):
        server_split_federation(p, f"noisy_removal.federations[{i}]", name, nr.validation_samples)


def inputs(p: Params) -> list[Path]:
    """The partition files of the federations valued (checked to exist before :func:`preflight`)."""
    return [Path(layout.PARTITIONS) / f"{name}.npz" for name in p.noisy_removal.federations]


def preflight(p: Params) -> None:
    """Every federation read holds what the partition format declares (labels, client indices, lengths,
    shapes, the manifest's sizes) and finite features (every client values its data: none can be left
    out) and within the float32 bound, and its projection fits it
    (:meth:`~otfed.data.parties.FeatureProjection.check_fits`) and its validation rows hold ≥ 4 of every class
    (the calibrated rule splits them) — before any server starts (DataError /
    DegenerateClientError naming the file, ConfigError naming the key, otherwise)."""
    nr = p.noisy_removal
    for name in nr.federations:
        fed = load_federation(name, layout.PARTITIONS, require_finite=True)
        nr.check_fits(fed, Path(layout.PARTITIONS) / f"{name}.npz", "noisy_removal")
        if nr.alpha is None:
            continue
        # the calibrated rule splits every class of the validation set, ≥ 2 rows on each side
        labels, counts = np.unique(server_split(fed, nr.validation_samples)[0].y, return_counts=True)
        if counts.min() < 4:
            raise ConfigError(f"noisy_removal.validation_samples: {nr.validation_samples} rows of {name!r}'s test "
                              f"split hold {counts.min()} of class {labels[counts.argmin()].item()!r}; the calibrated "
                              "rule splits every class into Q and calibration rows and needs ≥ 4 per class (or set "
                              "noisy_removal.alpha: null)",
                              keys=("noisy_removal.validation_samples",))


# -------------------------------------------------------------------------------------------- jobs
def jobs(p: Params, dirs: Mapping[str, Path]) -> list[Job]:
    """One removal experiment per (noisy federation, seed) (features projected as the params say)."""
    # FedAvg runs on run.device; on CPU one torch thread per task (pinned once, for the stage)
    device = stage_device(p.run.device)
    nr, seed = p.noisy_removal, p.run.seed
    out = []
    for name in nr.federations:
        fed = nr.project(load_federation(name, layout.PARTITIONS, require_finite=True), seed)
        validation, test = server_split(fed, nr.validation_samples)
        for s in range(seed, seed + nr.seeds):
            out.append(Job(f"noisy-removal {name} seed {s}", removal_experiment, dict(
                name=name, clients=client_sets(fed), noisy=[fed.corrupted[fed.rows(k)] for k in range(fed.n_clients)],
                validation=validation, test=test, config=nr.fedbary, fedavg=nr.fedavg,
                max_remove_fraction=nr.max_remove_fraction, budgets=nr.budgets, alpha=nr.alpha,
                calibration_fraction=nr.calibration_fraction, seed=s, device=device),
                key=("removal", name, s)))
    return out


class Removal(NamedTuple):
    """One (federation, seed): the table-4 row, one row per client, the accuracy of every budget."""

    summary: dict[str, Any]
    clients: list[dict[str, Any]]
    budgets: list[dict[str, Any]]


def removal_experiment(name: str, clients: list[LabelledData], noisy: list[np.ndarray], validation: LabelledData,
                       test: tuple[np.ndarray, np.ndarray], config: FedBaryConfig, fedavg: FedAvgConfig,
                       max_remove_fraction: float, budgets: Sequence[float], alpha: float | None,
                       calibration_fraction: float, seed: int, device: str) -> Removal:
    """FedBary table 4 for one federation and seed. FedBary runs with the server's validation set as Q;
    each client computes its calibrated gradients g (eq. 10) locally and drops data by one of two rules:

    * ``flagged`` — the paper's rule: every datum with g > 0 (at most ``max_remove_fraction`` of its data);
    * ``budget`` — the b largest-g share of its data, b ∈ ``budgets``; the server picks b by the FedAvg
      accuracy on its *validation* set (ties → the smaller b), never by the test set;
    * ``calibrated`` — every datum whose standardised g exceeds the split-conformal (1 − ``alpha``) threshold (at most
      ``max_remove_fraction`` of its data), from a second session (:func:`calibrated_detection`): Q = the
      reference part of the validation set, its calibration part (``calibration_fraction``) one more clean
      party whose values set the threshold. Its measured false-positive rate (flagged clean rows / clean rows,
      and on the clients without planted noise) is reported next to α, and the g > 0 rule's next to it.

    FedAvg (on ``device``) is trained on all data and on what each rule keeps; accuracies are on the
    server's test set. References: dropping exactly the noisy data (oracle) and as many random data per
    client as the budget rule drops. Also the ROC AUC of g against the planted noise and, per client, what
    each rule removed."""
    start = time.perf_counter()
    res = federated_valuation(clients, config, validation=validation, seed=seed, datum_values=True,
                              potential=config.potential)
    fedbary_seconds = time.perf_counter() - start
    n_classes = n_classes_of(test[1], validation.y, *[c.y for c in clients])
    threads = threads_for(device)
    values = [res.datum_values[c.name] for c in clients]

    def kept(masks: Sequence[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(c.x[~m], c.y[~m]) for c, m in zip(clients, masks)]

    def accuracies(masks: Sequence[np.ndarray]) -> tuple[float, float]:
        """FedAvg trained once on what ``masks`` keep; its (validation, test) accuracy."""
        state = fedavg_state(kept(masks), test[0].shape[1], n_classes, fedavg, seed, device=device,
                             num_threads=threads)
        return tuple(evaluate(state, x, y, device=device, num_threads=threads)  # type: ignore[return-value]
                     for x, y in ((validation.x, validation.y), test))

    def removed(masks: Sequence[np.ndarray]) -> tuple[int, int]:
        """(data removed, noisy data among them), over all clients."""
        return int(sum(m.sum() for m in masks)), int(sum((m & bad).sum() for m, bad in zip(masks, noisy)))

    budget_masks = {b: [budget_removal(g, b) for g in values] for b in budgets}
    budget_rows = []
    for b, masks in budget_masks.items():
        val_acc, test_acc = accuracies(masks)
        n_removed, n_removed_noisy = removed(masks)
        budget_rows.append(dict(federation=name, seed=seed, budget=b, removed=n_removed,
                                removed_noisy=n_removed_noisy, validation_accuracy=val_acc,
                                test_accuracy=test_acc))
    best = max(budget_rows, key=lambda r: (r["validation_accuracy"], -r["budget"]))
    chosen = budget_masks[best["budget"]]
    flagged = [flagged_removal(g, max_remove_fraction) for g in values]
    random_masks = random_removal(chosen, np.random.default_rng(np.random.SeedSequence([seed, 11])))
    acc = {key: accuracies(masks)[1] for key, masks in (("flagged", flagged), ("oracle", noisy),
                                                       ("random", random_masks))}
    acc["budget"] = best["test_accuracy"]
    start = time.perf_counter()
    det = None if alpha is None else calibrated_detection(
        clients, config, validation, alpha=alpha, calibration_fraction=calibration_fraction, seed=seed,
        potential=config.potential)
    calibrated_seconds = time.perf_counter() - start
    # without the calibrated rule (alpha null): nothing flagged, its accuracy and rates nan
    cal_flags = [np.zeros(len(g), dtype=bool) if det is None else det.flags[c.name] for c, g in zip(clients, values)]
    calibrated = [np.zeros(len(g), dtype=bool) if det is None else
                  flagged_removal(det.scores[c.name], max_remove_fraction, det.threshold)
                  for c, g in zip(clients, values)]
    acc["calibrated"] = float("nan") if det is None else accuracies(calibrated)[1]
    # nothing removed: budget 0's model when it is a candidate (the same training), else trained here
    acc["before"] = next((r["test_accuracy"] for r in budget_rows if r["budget"] == 0.0), None)
    if acc["before"] is None:
        acc["before"] = accuracies([np.zeros(len(g), dtype=bool) for g in values])[1]
    all_noisy = np.concatenate(noisy)
    g_flags = [flag_noisy(g) for g in values]  # the paper's rule, g > 0
    client_rows = []
    for k, (c, bad, g) in enumerate(zip(clients, noisy, values)):
        client_rows.append(dict(federation=name, seed=seed, client=c.name, n=len(g), noisy=int(bad.sum()),
                                flagged=int(g_flags[k].sum()), flagged_noisy=int((g_flags[k] & bad).sum()),
                                removed_flagged=int(flagged[k].sum()),
                                removed_flagged_noisy=int((flagged[k] & bad).sum()),
                                removed_budget=int(chosen[k].sum()), removed_budget_noisy=int((chosen[k] & bad).sum()),
                                flagged_calibrated=int(cal_flags[k].sum()),
                                flagged_calibrated_noisy=int((cal_flags[k] & bad).sum()),
                                removed_calibrated=int(calibrated[k].sum()),
                                removed_calibrated_noisy=int((calibrated[k] & bad).sum()),
                                noisy_in_top_noisy=int(bad[most_suspicious(g, int(bad.sum()))].sum()),
                                contribution_percent=float(res.contributions[k])))

    n_flagged, flagged_noisy = removed(flagged)
    n_budget, budget_noisy = removed(chosen)
    n_calibrated, calibrated_noisy = removed(calibrated)
    clean_rows = int((~all_noisy).sum())
    clean_clients = [k for k, bad in enumerate(noisy) if not bad.any()]

    def fpr(masks: Sequence[np.ndarray], ks: Sequence[int]) -> float:
        """Flagged clean rows / clean rows over the clients ``ks`` (nan without any)."""
        rows = sum(int((~noisy[k]).sum()) for k in ks)
        return sum(int((masks[k] & ~noisy[k]).sum()) for k in ks) / rows if rows else float("nan")

    everyone = range(len(clients))
    summary = dict(federation=name, seed=seed, n_train=int(len(all_noisy)), noisy=int(all_noisy.sum()),
                   auc=detection_auc(np.concatenate(values), all_noisy),
                   removed_flagged=n_flagged, removed_flagged_noisy=flagged_noisy,
                   precision_flagged=flagged_noisy / n_flagged if n_flagged else 0.0,
                   recall_flagged=flagged_noisy / all_noisy.sum() if all_noisy.sum() else 0.0,
                   budget=best["budget"], removed_budget=n_budget, removed_budget_noisy=budget_noisy,
                   alpha=float("nan") if alpha is None else alpha,
                   threshold_calibrated=float("nan") if det is None else det.threshold, removed_calibrated=n_calibrated,
                   removed_calibrated_noisy=calibrated_noisy,
                   precision_calibrated=calibrated_noisy / n_calibrated if n_calibrated else 0.0,
                   recall_calibrated=calibrated_noisy / all_noisy.sum() if all_noisy.sum() else 0.0,
                   fpr_flagged=fpr(g_flags, everyone), fpr_calibrated=float("nan") if det is None else fpr(cal_flags, everyone),
                   fpr_flagged_clean_clients=fpr(g_flags, clean_clients),
                   fpr_calibrated_clean_clients=float("nan") if det is None else fpr(cal_flags, clean_clients),
                   clean_rows=clean_rows,
                   accuracy_before=acc["before"], accuracy_flagged=acc["flagged"], accuracy_budget=acc["budget"],
                   accuracy_calibrated=acc["calibrated"],
                   accuracy_oracle_removal=acc["oracle"], accuracy_random_removal=acc["random"],
                   fedbary_seconds=fedbary_seconds, calibrated_seconds=calibrated_seconds)
    return Removal(summary, client_rows, budget_rows)


# ------------------------------------------------------------------------------------------ report
ACCURACIES = ("accuracy_before", "accuracy_flagged", "accuracy_budget", "accuracy_calibrated",
              "accuracy_oracle_removal", "accuracy_random_removal")


def seed_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per federation, over its seeds: mean and 95% CI half-width (Student t) of every accuracy, of the
    paired gains (rule − before, same seed) and of the removal counts."""
    rows = []
    for name, sub in table.groupby("federation", sort=False):
        row: dict[str, Any] = dict(federation=name, seeds=len(sub))
        cols = {c: sub[c].to_numpy(dtype=np.float64) for c in (*ACCURACIES, "auc", "budget", "removed_flagged",
                                                                "removed_flagged_noisy", "removed_budget",
                                                                "removed_budget_noisy", "removed_calibrated",
                                                                "removed_calibrated_noisy", "fpr_flagged",
                                                                "fpr_calibrated", "fpr_flagged_clean_clients",
                                                                "fpr_calibrated_clean_clients")}
        before = cols["accuracy_before"]
        for c in ACCURACIES[1:]:
            cols[f"gain_{c.removeprefix('accuracy_')}"] = cols[c] - before
        for c, v in cols.items():
            row[c], row[f"{c}_ci95"] = mean_confidence_interval(v)
        row["noisy"] = int(sub.noisy.iloc[0])
        row["alpha"] = float(sub.alpha.iloc[0])
        rows.append(row)
    return pd.DataFrame(rows)


def report(p: Params, results: Results, out: Report, dirs: Mapping[str, Path]) -> dict[str, Any]:
    """Table 4 per seed (``removal.csv``) and over seeds (``removal_summary.csv``: mean ± 95% CI), per-client
    rows, every budget's validation and test accuracy, the before/after figure; one nested run per
    federation. Each result: a :class:`Removal`, under ``("removal", federation, seed)``."""
    removals: list[Removal] = results.of("removal")  # every (federation, seed), in job order
    table = pd.DataFrame([r.summary for r in removals])
    out.table(table, "removal.csv")
    out.table(pd.DataFrame([c for r in removals for c in r.clients]), "removal_clients.csv")
    budgets = pd.DataFrame([b for r in removals for b in r.budgets])
    out.table(budgets, "removal_budgets.csv")
    summary = seed_summary(table)
    out.table(summary, "removal_summary.csv")
    out.figure(figs.removal_figure(summary, budgets), "removal.png")
    metrics: dict[str, Any] = {}
    for r in summary.to_dict("records"):
        name = r.pop("federation")
        metrics[name] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
        with out.variant(f"removal/{name}", tags={"federation": name}) as child:
            child.log_metrics({k: float(v) for k, v in r.items() if np.isfinite(float(v))})
    return metrics


STAGE = Stage("noisy_removal", NoisyRemovalParams, OUTPUTS, jobs, report, check, preflight=preflight, inputs=inputs,
              headline=("*.accuracy_before", "*.accuracy_flagged", "*.accuracy_budget",  # table 4
                        "*.accuracy_oracle_removal", "*.gain_budget", "*.gain_budget_ci95", "*.auc",
                        "*.accuracy_calibrated", "*.fpr_calibrated", "*.fpr_flagged"))
