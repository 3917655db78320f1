"""Benchmark: KNOT's Sinkhorn loss T_ε (eq. 1, batched over B samples × K teachers) by backend — otfed's
fixed-shape solver (``solver="fixed"``, the default), otfed's adaptive Newton solver (``solver="newton"``),
geomloss's tensorized Sinkhorn and POT — side by side in one run.

Setting (defaults): SA's 5 labels on the line 1..5 (cost |i − j|), K = 6 teachers, B ∈ {32, 256},
ε ∈ {0.1, 0.01, 0.001}; student and teacher histograms = softmax of N(0, 3²) logits in float32 (as in
training; renormalised exactly in float64 for POT and geomloss, whose marginal constraints need equal
masses); one torch/BLAS thread (``--threads``). Each backend computes the B·K values and their gradient
w.r.t. the student histograms (forward + backward, as in a training step), except POT (forward only,
one NumPy call per pair, timed on ``--reference-pairs`` pairs and extrapolated to B·K). The backends are
interleaved: every round calls each once, in an order rotated from round to round; after one warm-up
round, the median of ``--repeats`` rounds is reported (CUDA: the device is synchronised before and after
each call).

- ``newton``: :func:`otfed.ot.sinkhorn_histogram_loss` with ``solver="newton"`` (ε-scaling, safeguarded
  semi-dual Newton, active sets);
- ``fixed``: the same with ``solver="fixed"`` (a precomputed plan of steps, no host synchronisation);
- ``geomloss s=0.5`` / ``s=0.9``: ``geomloss.SamplesLoss("sinkhorn", p=1, blur=ε, scaling=s, debias=False,
  backend="tensorized")`` on the B·K pairs batched (label points as 1-D coordinates; p = 1 gives the
  cost |x − y| and ε = blur). Its value is the regularised eq. 1 value ⟨P, C⟩ + ε KL(P | μ⊗ν), so it is
  compared with POT's plan's regularised value; its plan (for the marginal error) is rebuilt from the
  potentials it returns with ``potentials=True``: P_ij = μ_i ν_j exp((f_i + g_j − C_ij)/ε);
- ``POT``: ``ot.sinkhorn2(..., method="sinkhorn_log")`` with its defaults (numItermax 1000, stopThr 1e-9).

Accuracy: ``max_rel_error_vs_pot`` — the largest |v − v_POT| / v_POT over the first ``--reference-pairs``
pairs, against POT's log-domain Sinkhorn run to convergence (numItermax 20,000, stopThr 1e-13; pairs on
which POT itself stops above 1e-10 are left out and counted in ``pot_unconverged``);
``max_marginal_error`` — the largest L1 error of the plan's column marginal ||Pᵀ1 − ν||₁ over all pairs
(otfed's rows are exact by construction; geomloss's row error is in ``max_row_error``).

Host synchronisation: ``host_syncs`` counts, in one forward + backward, the operations that make the host
wait for a GPU (``.item()``, ``bool()``, ``.tolist()``, ``float()``, linear algebra that reads back its error
flags, boolean indexing, ``nonzero``), recorded by :class:`otfed.host_sync.HostSyncs`, so it is counted on
the CPU as well; ``torch_ops`` counts every dispatched torch operation of that call
(on a GPU each is roughly one kernel launch, a few µs of host time each in eager mode).

    python -m bench.sinkhorn_backends                  # CPU (≈10 min on the 2 shared cores here)
    python -m bench.sinkhorn_backends --device cuda    # on a GPU

    python -m bench.sinkhorn_backends --convergence-sweep --seeds 0 1 2 --solvers fixed newton

Results: reports/bench/sinkhorn_backends.csv (and .md with a summary); the sweep writes
reports/bench/sinkhorn_convergence.csv — per seed, cost (KNOT's SA, ERC, NLI and one-hot-ablation costs,
plus the authors' 6-D coordinates and 7 random points), kind of histograms (:func:`sweep_histograms`)
and ε ∈ {1e-1, 1e-2, 3e-3, 1e-3}, 256 × 6 pairs: how many stay above the tolerance 1e-9, the worst
marginal error, the time. The training-step benchmark (Sinkhorn vs KL step with a model) is
``bench/distill_step.py``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from otfed import io
from otfed.device import pin_torch_threads
from otfed.host_sync import HostSyncs
from otfed.label_space import LabelSpace
from otfed.ot import entropic_histogram_transport, sinkhorn_histogram_loss

OUT = Path("reports/bench")


def pot_reference(p64: np.ndarray, q64: np.ndarray, cost: np.ndarray, eps: float, pairs: list[tuple[int, int]]):
    """(transport ⟨P, C⟩, regularised ⟨P, C⟩ + ε KL(P | μ⊗ν), POT's final error) per pair, POT run to
    convergence."""
    import ot

    out = []
    for b, k in pairs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            P, log = ot.sinkhorn(p64[b], q64[b, k], cost, eps, method="sinkhorn_log", numItermax=20_000,
                                 stopThr=1e-13, log=True)
        ref = p64[b][:, None] * q64[b, k][None, :]
        mask = P > 0
        kl = float((P[mask] * np.log(P[mask] / ref[mask])).sum() - P.sum() + ref.sum())
        transport = float((P * cost).sum())
        out.append((transport, transport + eps * kl, float(log["err"][-1])))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--teachers", type=int, default=6)
    parser.add_argument("--eps", type=float, nargs="+", default=[1e-1, 1e-2, 1e-3])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--reference-pairs", type=int, default=24, help="pairs solved by POT (reference and timing)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--convergence-sweep", action="store_true", help="run the robustness grid instead")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds of the convergence sweep")
    parser.add_argument("--solvers", nargs="+", default=["fixed"], help="solvers of the convergence sweep")
    args = parser.parse_args(argv)
    pin_torch_threads(args.threads)
    if args.convergence_sweep:
        return convergence_sweep(args.seeds, args.solvers, args.out)
    import geomloss
    import ot

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    space = LabelSpace.for_task("sa")
    cost = space.cost_matrix()
    n, K = space.n_labels, args.teachers
    points = space.coordinates.to(torch.float32)
    rows = []
    load_before = os.getloadavg()
    for B in args.batch:
        g = torch.Generator().manual_seed(args.seed)
        p = torch.softmax(3 * torch.randn(B, n, generator=g), -1)  # float32, as in training
        q = torch.softmax(3 * torch.randn(B, K, n, generator=g), -1)
        p64, q64 = p.double() / p.double().sum(-1, keepdim=True), q.double() / q.double().sum(-1, keepdim=True)
        pn, qn, cn = p64.numpy(), q64.numpy(), cost.numpy()
        m = min(args.reference_pairs, B * K)
        pairs = [(i // K, i % K) for i in range(m)]
        p_d, q_d, cost_d = p.to(device), q.to(device), cost.to(device)
        alpha = p64.float()[:, None, :].expand(B, K, n).reshape(B * K, n).contiguous().to(device)
        beta = q64.float().reshape(B * K, n).to(device)
        xs = points.expand(B * K, n, points.shape[1]).contiguous().to(device)
        # accuracy is measured in float64 (timing in float32, as in training)
        p64_d, q64_d = p64.to(device), q64.to(device)
        beta64, xs64 = q64.reshape(B * K, n).to(device), xs.double()
        for eps in args.eps:
            reference = pot_reference(pn, qn, cn, eps, pairs)
            ok = [i for i, r in enumerate(reference) if r[2] <= 1e-10]
            ref_transport = np.array([r[0] for r in reference])
            ref_regularized = np.array([r[1] for r in reference])

            def otfed_call(solver):
                def call():
                    x = p_d.clone().requires_grad_(True)
                    value = sinkhorn_histogram_loss(x, q_d, cost_d, eps, solver=solver, on_unconverged="ignore")
                    value.sum().backward()
                    return value.detach()
                return call

            def geomloss_call(scaling):
                loss = geomloss.SamplesLoss("sinkhorn", p=1, blur=eps, scaling=scaling, debias=False,
                                            backend="tensorized")

                def call():
                    a = alpha.clone().requires_grad_(True)
                    value = loss(a, xs, beta, xs)
                    value.sum().backward()
                    return value.detach()
                return call, loss

            def pot_call():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return [ot.sinkhorn2(pn[b], qn[b, k], cn, eps, method="sinkhorn_log") for b, k in pairs]

            backends = {"newton": otfed_call("newton"), "fixed": otfed_call("fixed")}
            geomlosses = {}
            for scaling in (0.5, 0.9):
                backends[f"geomloss s={scaling}"], geomlosses[f"geomloss s={scaling}"] = geomloss_call(scaling)
            backends["POT"] = pot_call
            names = list(backends)
            times = {name: [] for name in names}
            for r in range(args.repeats + 1):
                for name in names[r % len(names):] + names[: r % len(names)]:
                    if cuda:
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    backends[name]()
                    if cuda:
                        torch.cuda.synchronize()
                    if r:
                        times[name].append(time.perf_counter() - start)
            for name in names:
                row = dict(batch=B, eps=eps, backend=name, pairs=B * K,
                           seconds_median=statistics.median(times[name]) * (B * K / m if name == "POT" else 1),
                           seconds_min=min(times[name]) * (B * K / m if name == "POT" else 1),
                           extrapolated=name == "POT", pot_unconverged=m - len(ok), reference_pairs=m)
                if name == "POT":
                    values = np.array(pot_call())
                    error = np.abs(values[ok] - ref_transport[ok])
                    row["max_rel_error_vs_pot"] = float(np.max(error / ref_transport[ok]))
                    row["max_abs_error_vs_pot"] = float(np.max(error))
                    row["value"] = "transport"
                else:
                    with HostSyncs() as record:
                        backends[name]()
                    row.update(host_syncs=len(record.syncs), torch_ops=len(record.ops))
                    if name.startswith("geomloss"):
                        alpha64 = p64[:, None, :].expand(B, K, n).reshape(B * K, n).to(device)
                        with torch.no_grad():
                            values = geomlosses[name](alpha64, xs64, beta64, xs64).cpu().numpy()
                        row["value"] = "regularized"
                        truth = ref_regularized
                        errors = _geomloss_marginal_errors(geomloss, eps, float(name.split("=")[1]), alpha64, beta64,
                                                           xs64)
                        row.update(max_marginal_error=errors[0], max_row_error=errors[1])
                    else:
                        with torch.no_grad():
                            result = entropic_histogram_transport(p64_d, q64_d, cost_d, eps, solver=name)
                        values = result.cost.double().cpu().numpy().reshape(-1)
                        row["value"] = "transport"
                        truth = ref_transport
                        row.update(max_marginal_error=float(result.marginal_error.max()), solver_steps=result.n_steps)
                    values = values.reshape(-1)[:m]
                    row["max_rel_error_vs_pot"] = float(np.max(np.abs(values[ok] - truth[ok]) / np.abs(truth[ok])))
                    row["max_abs_error_vs_pot"] = float(np.max(np.abs(values[ok] - truth[ok])))
                rows.append(row)
                print(f"B={B:<4} eps={eps:<6g} {name:<15} {row['seconds_median'] * 1e3:9.2f} ms"
                      f"  rel err vs POT {row['max_rel_error_vs_pot']:.1e}"
                      f"  marginal err {row.get('max_marginal_error', float('nan')):.1e}"
                      f"  syncs {row.get('host_syncs', '-')}  ops {row.get('torch_ops', '-')}", flush=True)
    load_after = os.getloadavg()
    table = pd.DataFrame(rows)
    setting = (f"device={args.device} K={K} C={n} threads={torch.get_num_threads()} "
               f"load_before={load_before[0]:.2f} load_after={load_after[0]:.2f}")
    table.insert(0, "setting", setting)
    print()
    print(table.drop(columns="setting").to_string(index=False))
    fixed = table[table.backend == "fixed"].set_index(["batch", "eps"])
    newton = table[table.backend == "newton"].set_index(["batch", "eps"])
    summary = (
        "# KNOT Sinkhorn loss by backend (forward + backward; POT forward only, extrapolated)\n\n"
        f"Setting: {setting}; SA cost, softmax(N(0, 3²)) histograms, {args.repeats} interleaved rounds "
        f"(`python -m bench.sinkhorn_backends --device {args.device}`).\n\n"
        "fixed vs newton, time per call (ms) and host syncs per forward + backward: "
        + "; ".join(f"B={b} ε={e:g}: {fixed.loc[(b, e), 'seconds_median'] * 1e3:.1f} vs "
                    f"{newton.loc[(b, e), 'seconds_median'] * 1e3:.1f} ms, {int(fixed.loc[(b, e), 'host_syncs'])} vs "
                    f"{int(newton.loc[(b, e), 'host_syncs'])} syncs"
                    for b, e in fixed.index)
        + ".\n\nA load average above the 2 cores means other processes shared them: times then swing between "
        "rounds.\n\n"
    )
    io.write_csv(table, args.out / "sinkhorn_backends.csv")
    io.write_text(summary + io.markdown_table(table), args.out / "sinkhorn_backends.md")
    return 0


SWEEP_EPS = (1e-1, 1e-2, 3e-3, 1e-3)
SWEEP_KINDS = ("dirichlet1", "dirichlet0.1", "dirichlet0.03", "logits", "near", "onehot", "peaked", "onehot-ish")


def sweep_costs() -> dict[str, torch.Tensor]:
    """KNOT's label costs (SA, ERC, NLI and the one-hot ablation's 2(1 − I)), and two costs it does not use:
    the authors' 6-D coordinates (reference-notes K2) and 7 random points in the plane (L1)."""
    costs = {task: LabelSpace.for_task(task).cost_matrix() for task in ("sa", "erc", "nli")}
    costs["sa-one-hot"] = LabelSpace.one_hot(LabelSpace.for_task("sa")).cost_matrix()
    coords = torch.cat([torch.eye(5, dtype=torch.float64), torch.arange(-2.0, 3.0, dtype=torch.float64)[:, None]], 1)
    costs["authors-6d"] = torch.cdist(coords, coords)
    x = torch.rand(7, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 2
    costs["random-7"] = (x[:, None] - x[None]).abs().sum(-1)
    return costs


def sweep_histograms(kind: str, n: int, B: int, K: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(student B×n, teachers B×K×n) of one kind: Dirichlet(α), softmax of N(0, 5²) (``logits``) or N(0, 10²)
    (``peaked``) logits, near-identical pairs (μ = ν·exp(1e-3·N(0, 1)) renormalised), one-hot students
    against Dirichlet(1) teachers (``onehot``), one-hot students against one-hot teachers smoothed by 1e-3."""
    def softmax(scale, shape):
        return torch.softmax(torch.as_tensor(scale * rng.standard_normal((*shape, n))), -1)

    if kind.startswith("dirichlet"):
        alpha = np.full(n, float(kind.removeprefix("dirichlet")))
        return torch.as_tensor(rng.dirichlet(alpha, B)), torch.as_tensor(rng.dirichlet(alpha, (B, K)))
    if kind in ("logits", "peaked"):
        scale = 5.0 if kind == "logits" else 10.0
        return softmax(scale, (B,)), softmax(scale, (B, K))
    if kind == "near":
        q = torch.as_tensor(rng.dirichlet(np.ones(n), (B, K)))
        p = q[:, 0] * torch.as_tensor(np.exp(1e-3 * rng.standard_normal((B, n))))
        return p / p.sum(-1, keepdim=True), q
    p = torch.as_tensor(np.eye(n)[rng.integers(n, size=B)])
    if kind == "onehot":
        return p, torch.as_tensor(rng.dirichlet(np.ones(n), (B, K)))
    return p, 0.999 * torch.as_tensor(np.eye(n)[rng.integers(n, size=(B, K))]) + 0.001 / n


def convergence_sweep(seeds: list[int], solvers: list[str], out: Path) -> int:
    """Each solver on the robustness grid: per seed, cost, kind of histograms and ε, 256 × 6 pairs (float32
    inputs, as in training): the pairs left above the tolerance 1e-9, the worst marginal error, the time.
    Writes sinkhorn_convergence.csv."""
    rows = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        for task, cost in sweep_costs().items():
            for kind in SWEEP_KINDS:
                p, q = sweep_histograms(kind, cost.shape[0], 256, 6, rng)
                for eps in SWEEP_EPS:
                    for solver in solvers:
                        start = time.perf_counter()
                        with warnings.catch_warnings(), torch.no_grad():
                            warnings.simplefilter("ignore")
                            r = entropic_histogram_transport(p.float(), q.float(), cost, eps, solver=solver)
                        rows.append(dict(seed=seed, cost=task, histograms=kind, eps=eps, solver=solver,
                                         pairs=q.shape[0] * q.shape[1],
                                         unconverged=int((r.marginal_error > r.tol).sum()),
                                         worst_marginal_error=float(r.marginal_error.max()), steps=r.n_steps,
                                         seconds=time.perf_counter() - start))
                        if rows[-1]["unconverged"]:
                            print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in rows[-1].items()), flush=True)
    table = pd.DataFrame(rows)
    knot = table.cost.isin(["sa", "erc", "nli", "sa-one-hot"])
    for solver, t in table.groupby("solver"):
        for name, part in (("KNOT costs", t[knot[t.index]]), ("other costs", t[~knot[t.index]])):
            print(f"{solver}, {name}: {int(part.unconverged.sum())} of {int(part.pairs.sum())} pairs above 1e-9, "
                  f"worst {part.worst_marginal_error.max():.2g}, {part.seconds.sum():.0f} s", flush=True)
    io.write_csv(table, out / "sinkhorn_convergence.csv")
    return 0


def _geomloss_marginal_errors(geomloss, eps, scaling, alpha, beta, xs):
    """(max column error ||Pᵀ1 − β||₁, max row error ||P1 − α||₁) of geomloss's plan, rebuilt from its
    potentials: P_ij = α_i β_j exp((f_i + g_j − C_ij)/ε) with C_ij = |x_i − x_j| (p = 1, ε = blur)."""
    loss = geomloss.SamplesLoss("sinkhorn", p=1, blur=eps, scaling=scaling, debias=False, backend="tensorized",
                                potentials=True)
    with torch.no_grad():
        f, g = loss(alpha, xs, beta, xs)
        C = (xs[:, :, None, :] - xs[:, None, :, :]).norm(dim=-1).double()
        log_plan = ((f.double()[:, :, None] + g.double()[:, None, :] - C) / eps
                    + alpha.double().log()[:, :, None] + beta.double().log()[:, None, :])
        P = log_plan.exp()
        column = (P.sum(-2) - beta.double()).abs().sum(-1)
        row = (P.sum(-1) - alpha.double()).abs().sum(-1)
    return float(column.max()), float(row.max())


if __name__ == "__main__":
    raise SystemExit(main())
