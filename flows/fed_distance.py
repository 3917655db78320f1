"""Prefect flow of stage ``fed_distance``: per-case / per-pair tasks; writes reports/fed_distance."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from otfed import io, tracking
from otfed.config import FedWaDParams, Params, flatten, groups, params_hash
from otfed.data.store import load_federation
from otfed.experiments import fed_distance as exp
from otfed.federation import FedWaDConfig, LabelledData, pairwise_federated_otdd
from otfed.errors import DegenerateClientError
from otfed.federation.otdd import (client_pairs, distance_matrix, federated_otdd, pair_seed,
                                   usable_clients)
from otfed.figures import fed_distance as figs
from otfed.metrics import order_preservation
from otfed.orchestration import fan_out, stage_flow

toy_case_task = task(name="toy-case", cache_policy=NO_CACHE)(exp.toy_case)
toy_convergence_task = task(name="toy-convergence", cache_policy=NO_CACHE)(exp.toy_convergence)
otdd_pair_task = task(name="otdd-pair", cache_policy=NO_CACHE)(exp.otdd_pair)
federated_otdd_task = task(name="federated-otdd-pair", cache_policy=NO_CACHE)(federated_otdd)


def fedwad_config(p: FedWaDParams, **overrides: Any) -> FedWaDConfig:
    """FedWaDConfig from its params group (``t: random`` → None)."""
    return FedWaDConfig(support_size=p.support_size, iterations=p.iterations,
                        t=None if p.t == "random" else float(p.t), p=p.p, interpolation=p.interpolation,
                        solver=p.solver, init_scale=p.init_scale, **overrides)


def fed_distance_flow_factory(params: Params) -> Any:
    """The stage flow, with the task runner named in ``run.task_runner``."""
    return stage_flow("fed_distance", fed_distance, params.run.task_runner, params.run.max_workers)


def fed_distance(params: dict) -> dict:
    """Stage ``fed_distance``: toy study (fig. 2–3), federated OTDD (fig. 6), client clustering (tables 1–5)."""
    p = Params.model_validate(params)
    read = groups(p, "run", "fed_distance")
    fd, seed = p.fed_distance, p.run.seed
    with tracking.stage_run("fed_distance", flatten(read), params_hash(read)) as run, \
            io.staged_directory(fd.out_dir) as out:
        metrics: dict[str, Any] = {}
        metrics["toy"] = _toy(fd, seed, run, out)
        degenerate: list[dict] = []
        metrics["otdd"] = _otdd(p, seed, run, out, degenerate)
        metrics["clustering"] = _clustering(p, seed, run, out, degenerate)
        run.log_table(pd.DataFrame(degenerate, columns=["federation", "client", "reason"]),
                      out / "degenerate_clients.csv")
        metrics["degenerate_clients"] = len(degenerate)
        io.write_json(metrics, out / "metrics.json")
        run.log_metrics(tracking.flat_metrics(metrics))
        run.log_artifact(out / "metrics.json")
    return metrics


# ------------------------------------------------------------------------------------------------ toy
def _toy(fd: Any, seed: int, run: tracking.TrackedRun, out: Path) -> dict:
    toy = fd.toy
    jobs = [dict(dim=d, ratio=r, n=n, repeat=k, supports=toy.supports, iterations=toy.iterations,
                 exact_interp_max_n=toy.exact_interp_max_n, seed=seed)
            for d in toy.dims for r in toy.ratios for n in toy.n_values for k in range(toy.repeats)
            if n // r >= 1]
    rows = pd.DataFrame([row for rows in fan_out(toy_case_task, jobs) for row in rows])
    run.log_table(rows, out / "toy_gaussians.csv")
    run.log_figure(figs.toy_figure(rows), out / "toy_time_error.png")
    # one nested run per method × support, rel_error logged with step = n (MLflow compare view)
    fed_rows = rows[rows.method != "exact_ot"]
    fed_rows = fed_rows.assign(support=np.where(fed_rows.method == "fedwad_exact_interp", "n",
                                                fed_rows.support.astype(str)))
    for (method, support), sub in fed_rows.groupby(["method", "support"]):
        with run.child(f"toy/{method}/S{support}", tags={"method": method, "support": support}) as child:
            child.log_params({"method": method, "support": support})
            for (dim, ratio), cell in sub.groupby(["dim", "ratio"]):
                for row in cell.groupby("n", as_index=False)[["rel_error", "seconds"]].mean().itertuples():
                    child.log_metrics({f"rel_error_d{dim}_r{ratio}": row.rel_error,
                                       f"seconds_d{dim}_r{ratio}": row.seconds}, step=int(row.n))

    conv_jobs = [dict(dim=d, n=toy.convergence_n, support=s, iterations=toy.iterations, interpolation=i, t=t,
                      seed=seed)
                 for d in toy.dims for (s, i, t) in [(10, "approx", None), (toy.convergence_n, "approx", None),
                                                     (toy.convergence_n, "approx", 0.5),
                                                     (toy.convergence_n, "exact", None)]]
    conv = pd.DataFrame([row for rows in fan_out(toy_convergence_task, conv_jobs) for row in rows])
    run.log_table(conv, out / "convergence.csv")
    run.log_figure(figs.convergence_figure(conv), out / "convergence.png")

    largest = rows[rows.n == rows.n.max()]
    summary = {}
    for (method, support, dim, ratio), cell in largest.groupby(["method", "support", "dim", "ratio"]):
        if method == "fedwad_approx":
            summary[f"{method}_S{support}_d{dim}_r{ratio}_rel_error"] = float(cell.rel_error.mean())
    exact_interp = rows[rows.method == "fedwad_exact_interp"]
    for (dim, ratio), cell in exact_interp[exact_interp.n == exact_interp.n.max()].groupby(["dim", "ratio"]):
        summary[f"fedwad_exact_interp_n{int(cell.n.iloc[0])}_d{dim}_r{ratio}_rel_error"] = float(cell.rel_error.mean())
    approx = rows[rows.method == "fedwad_approx"]
    exact_rows = rows[rows.method == "exact_ot"]
    summary["max_n"] = int(rows.n.max())
    summary["seconds_fedwad_approx_total"] = float(approx.seconds.sum())
    summary["seconds_exact_ot_total"] = float(exact_rows.seconds.sum())
    last = conv.sort_values("iteration").groupby(["dim", "setting"]).tail(1)
    for r in last.itertuples():
        summary[f"convergence_gap_d{r.dim}_{r.interpolation}_S{r.support}_t{r.t}"] = float(r.rel_gap)
    return summary


# ----------------------------------------------------------------------------------------------- OTDD
def _clients(name: str, out_dir: str, diagonal: bool, degenerate: list[dict]) -> tuple[list[LabelledData], np.ndarray]:
    """The federation's usable clients and their planted groups; degenerate ones go to ``degenerate``."""
    fed = load_federation(name, out_dir)
    clients = [LabelledData(fed.client_names[k], *fed.client_data(k)) for k in range(fed.n_clients)]
    keep, problems = usable_clients(clients, diagonal)
    degenerate.extend(dict(federation=name, client=c, reason=r) for c, r in problems)
    if len(keep) < 2:
        raise DegenerateClientError(f"federation {name!r}: fewer than 2 usable clients; "
                                    + "; ".join(r for _, r in problems))
    return [clients[k] for k in keep], fed.client_group[keep]


def _otdd(p: Params, seed: int, run: tracking.TrackedRun, out: Path, degenerate: list[dict]) -> dict:
    cfg = p.fed_distance.otdd
    clients, _ = _clients(cfg.federation, p.partition.out_dir, cfg.diagonal, degenerate)
    config = fedwad_config(cfg.fedwad)
    pairs = client_pairs(len(clients), include_diagonal=True)
    jobs = [dict(a=clients[i], b=clients[j], config=config, seed=pair_seed(seed, i, j), diagonal=cfg.diagonal)
            for i, j in pairs]
    results = fan_out(otdd_pair_task, jobs)
    table = pd.DataFrame(results)
    run.log_table(table, out / "otdd_pairs.csv")
    names = [c.name for c in clients]
    fed_m = distance_matrix(len(clients), pairs, [r["federated"] for r in results])
    exact_m = distance_matrix(len(clients), pairs, [r["exact"] for r in results])
    order = order_preservation(exact_m, fed_m)
    run.log_figure(figs.otdd_heatmaps(names, fed_m, exact_m, order), out / "otdd_heatmaps.png")
    off = table[table.a != table.b]
    rel = (off.federated - off.exact).abs() / off.exact
    summary = {"order_preserved": order, "mean_rel_error": float(rel.mean()), "max_rel_error": float(rel.max()),
               "self_distance_federated_max": float(table[table.a == table.b].federated.max()),
               "self_distance_exact_max": float(table[table.a == table.b].exact.max()),
               "bytes_per_pair": float(off.bytes.mean())}
    with run.child("otdd", tags={"federation": cfg.federation}) as child:
        child.log_metrics(summary)
    return summary


# ----------------------------------------------------------------------------------------- clustering
def _clustering(p: Params, seed: int, run: tracking.TrackedRun, out: Path, degenerate: list[dict]) -> dict:
    cfg = p.fed_distance.clustering
    config = fedwad_config(cfg.fedwad)
    summary: dict[str, Any] = {}
    score_rows, ledgers = [], []
    for name in cfg.federations:
        clients, groups_ = _clients(name, p.partition.out_dir, cfg.diagonal, degenerate)
        d, ledger = pairwise_federated_otdd(clients, config, seed=seed, diagonal=cfg.diagonal,
                                            map_fn=lambda fn, jobs: fan_out(federated_otdd_task, jobs))
        n_clusters = min(cfg.n_clusters, len(np.unique(groups_)), len(clients))
        rows, labels = exp.clustering_scores(d, groups_, max(n_clusters, 2), cfg.neighbors, seed)
        for row in rows:
            row["federation"] = name
        score_rows.extend(rows)
        matrix = pd.DataFrame(d, columns=[c.name for c in clients])
        matrix.insert(0, "client", [c.name for c in clients])
        matrix.insert(1, "group", groups_)
        for method, lab in labels.items():
            matrix[f"cluster_{method}"] = lab
        run.log_table(matrix, out / f"clustering_{name}_distances.csv", markdown=False)
        best = max(r["ari"] for r in rows)
        run.log_figure(figs.clustering_heatmap(d, groups_, f"{name}: federated OTDD (best ARI {best:.2f})"),
                       out / f"clustering_{name}.png")
        cost = ledger.cost_table()
        cost.insert(0, "federation", name)
        ledgers.append(cost)
        summary[name] = {r["method"]: r["ari"] for r in rows}
        with run.child(f"clustering/{name}", tags={"federation": name}) as child:
            child.log_metrics({f"ari_{r['method']}": r["ari"] for r in rows} |
                              {"bytes_total": float(ledger.total_bytes)})
    run.log_table(pd.DataFrame(score_rows)[["federation", "method", "n_neighbors", "ari", "n_clusters_found"]],
                  out / "clustering_ari.csv")
    run.log_table(pd.concat(ledgers, ignore_index=True), out / "communication.csv")
    return summary
