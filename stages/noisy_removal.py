"""Stage ``noisy_removal`` — FedBary table 4 (SPEC §3 "Boost FL"): clients drop what FedBary flags.

5 clients with planted noise; the server holds a validation set (FedBary's target Q) and a test set.
Each client computes its datum values locally (calibrated gradients against η_{Q_i}, eq. 10), drops what
it flags, and FedAvg is trained on all data and on what is kept — with oracle and random removal of as
many points for reference. One job per noisy federation.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import pandas as pd
from pydantic import Field

from otfed.data.parties import client_sets, n_classes_of, project_federation, server_split
from otfed.data.store import load_federation
from otfed.device import stage_device, threads_for
from otfed.federation.fedbary import FedBaryConfig, federated_valuation
from otfed.figures import valuation as figs
from otfed.fl import FedAvgConfig, fedavg_accuracy
from otfed.ot.otdd import LabelledData
from otfed.schema import Strict
from otfed.valuation import flag_noisy
from stages import layout
from stages.params import server_split_federation
from stages.stage import Job, Report, Stage

if TYPE_CHECKING:
    from stages.params import Params

# the folders this stage writes (declared in stages/layout.py); the first holds its reports and metrics.json
OUTPUTS = (layout.REMOVAL_REPORTS,)


# ------------------------------------------------------------------------------------------ params
class NoisyRemovalParams(Strict):
    """Stage ``noisy_removal`` (table 4): clients drop what FedBary flags; FedAvg before vs after."""

    federations: list[str] = Field(["fmnist_label_noise", "fmnist_feature_noise"], min_length=1)
    pca_components: int = Field(32, ge=0)
    validation_samples: int = Field(500, ge=10, description="Server validation = first rows of the test split; "
                                    "the rest is the test set.")
    max_remove_fraction: float = Field(1.0, gt=0.0, le=1.0,
                                       description="Cap on the share of a client's data it removes (top values).")
    fedbary: FedBaryConfig = FedBaryConfig()
    fedavg: FedAvgConfig = FedAvgConfig(rounds=20)


def check(p: Params) -> None:
    """The federations exist, have a server test split and more test rows than ``validation_samples``."""
    nr = p.noisy_removal
    for i, name in enumerate(nr.federations):
        server_split_federation(p, f"noisy_removal.federations[{i}]", name, nr.validation_samples)


# -------------------------------------------------------------------------------------------- jobs
def jobs(p: Params, dirs: Mapping[str, Path]) -> list[Job]:
    """One removal experiment per noisy federation (features projected as the params say)."""
    # FedAvg runs on run.device; on CPU one torch thread per task (pinned once, for the stage)
    device = stage_device(p.run.device)
    nr, seed = p.noisy_removal, p.run.seed
    out = []
    for name in nr.federations:
        fed = project_federation(load_federation(name, layout.PARTITIONS, require_finite=True), nr.pca_components,
                                 seed)
        validation, test = server_split(fed, nr.validation_samples)
        out.append(Job(f"noisy-removal {name}", removal_experiment, dict(
            name=name, clients=client_sets(fed), noisy=[fed.corrupted[fed.rows(k)] for k in range(fed.n_clients)],
            validation=validation, test=test, config=nr.fedbary, fedavg=nr.fedavg,
            max_remove_fraction=nr.max_remove_fraction, seed=seed, device=device)))
    return out


def removal_experiment(name: str, clients: list[LabelledData], noisy: list[np.ndarray], validation: LabelledData,
                       test: tuple[np.ndarray, np.ndarray], config: FedBaryConfig, fedavg: FedAvgConfig,
                       max_remove_fraction: float, seed: int,
                       device: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """FedBary table 4 for one federation: FedBary with the server's validation set; every client drops
    the data it flags (calibrated gradient > 0; at most ``max_remove_fraction`` of its data, the largest
    values first); FedAvg on all data vs on what is kept, accuracy on the server's test set. For reference
    also FedAvg after dropping exactly the noisy data (oracle) and after dropping as many random data per
    client. ``noisy_in_top_noisy``: noisy data among each client's n_noisy largest values (a ranking score
    that does not depend on the g > 0 threshold). FedAvg runs on ``device``. Returns the table row and one
    row per client."""
    start = time.perf_counter()
    res = federated_valuation(clients, config, validation=validation, seed=seed, datum_values=True,
                              potential=config.potential)
    fedbary_seconds = time.perf_counter() - start
    rng = np.random.default_rng(np.random.SeedSequence([seed, 11]))
    kept, oracle, random_kept, client_rows = [], [], [], []
    names = [c.name for c in clients]
    for c, bad in zip(clients, noisy):
        g = res.datum_values[c.name]
        flagged = flag_noisy(g)
        cap = int(np.floor(max_remove_fraction * len(g)))
        order = np.argsort(-g, kind="stable")
        remove = np.zeros(len(g), dtype=bool)
        remove[order[:min(int(flagged.sum()), cap)]] = True
        kept.append((c.x[~remove], c.y[~remove]))
        oracle.append((c.x[~bad], c.y[~bad]))
        drop = rng.choice(len(g), int(remove.sum()), replace=False)
        keep_r = np.ones(len(g), dtype=bool)
        keep_r[drop] = False
        random_kept.append((c.x[keep_r], c.y[keep_r]))
        client_rows.append(dict(federation=name, client=c.name, n=len(g), noisy=int(bad.sum()),
                                flagged=int(flagged.sum()), removed=int(remove.sum()),
                                removed_noisy=int((remove & bad).sum()),
                                noisy_in_top_noisy=int(bad[order[:int(bad.sum())]].sum()),
                                contribution_percent=float(res.contributions[names.index(c.name)])))
    n_classes = n_classes_of(test[1], validation.y, *[c.y for c in clients])
    every = [(c.x, c.y) for c in clients]
    threads = threads_for(device)
    acc = {key: fedavg_accuracy(sets, test, n_classes, fedavg, seed, device=device, num_threads=threads)
           for key, sets in (("before", every), ("after", kept), ("oracle", oracle), ("random", random_kept))}
    all_noisy = np.concatenate(noisy)
    removed = sum(r["removed"] for r in client_rows)
    removed_noisy = sum(r["removed_noisy"] for r in client_rows)
    summary = dict(federation=name, n_train=int(len(all_noisy)), noisy=int(all_noisy.sum()),
                   flagged=sum(r["flagged"] for r in client_rows), removed=removed, removed_noisy=removed_noisy,
                   precision=removed_noisy / removed if removed else 0.0,
                   recall=removed_noisy / all_noisy.sum() if all_noisy.sum() else 0.0,
                   noisy_in_top_noisy=sum(r["noisy_in_top_noisy"] for r in client_rows),
                   accuracy_before=acc["before"], accuracy_after=acc["after"],
                   accuracy_oracle_removal=acc["oracle"], accuracy_random_removal=acc["random"],
                   fedbary_seconds=fedbary_seconds)
    return summary, client_rows


# ------------------------------------------------------------------------------------------ report
def report(p: Params, results: list[tuple[dict[str, Any], list[dict[str, Any]]]], out: Report,
           dirs: Mapping[str, Path]) -> dict[str, Any]:
    """Table 4 (``removal.csv``), per-client rows, the before/after figure; one nested run per federation."""
    table = pd.DataFrame([s for s, _ in results])
    out.table(table, "removal.csv")
    out.table(pd.DataFrame([r for _, rows in results for r in rows]), "removal_clients.csv")
    out.figure(figs.removal_figure(table), "removal.png")
    metrics: dict[str, Any] = {}
    for r in table.to_dict("records"):
        name = r.pop("federation")
        metrics[name] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
        with out.variant(f"removal/{name}", tags={"federation": name}) as child:
            child.log_metrics({k: float(v) for k, v in r.items() if np.isfinite(float(v))})
    return metrics


STAGE = Stage("noisy_removal", NoisyRemovalParams, OUTPUTS, jobs, report, check,
              headline=("*.accuracy_before", "*.accuracy_after", "*.accuracy_oracle_removal",  # table 4
                        "*.noisy", "*.removed", "*.removed_noisy"))

if __name__ == "__main__":  # DVC: python -m stages.noisy_removal
    from flows.stage import main
    raise SystemExit(main(STAGE))
