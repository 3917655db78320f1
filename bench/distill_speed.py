"""Benchmark: the KNOT Sinkhorn loss alone (no model) for a transfer batch of B samples × K teachers × C
labels — otfed's batched solver vs POT's ``ot.sinkhorn2`` called per (sample, teacher) pair vs geomloss
``SamplesLoss("sinkhorn", p=1, blur=ε, backend="tensorized")`` called per pair and batched (the
authors' code calls geomloss batched with its default ε-scaling 0.5 and debias=False).

Setting (defaults): B = 1024, K = 6, C = 5 SA labels on the line 1..5 (cost |i − j|), ε ∈ {1e-3 (the
papers' value), 1e-2, 1e-1}, histograms = softmax of N(0, 3²) logits, float32 inputs as in training
(renormalised exactly in float64 for POT and geomloss, whose marginal constraints need equal masses);
one torch/BLAS thread for every method (the machine is shared; otfed's loss also runs its solve on one
intra-op thread by default). Every method runs in the same process, side by side; times are medians of
``--repeats`` runs after a warm-up. The per-pair loops (POT, geomloss per pair) are timed on the first
``--per-pair`` pairs and extrapolated linearly to all B·K pairs (marked in the table).

Accuracy, two columns: ``max_abs_error_vs_w1`` against the exact W1, which on SA's unit-spaced line has
the closed form Σ_l |F_μ(l) − F_ν(l)| (the entropic values exceed it by up to ε·log 5 by construction);
``max_abs_error_vs_entropic`` against the converged value of the same entropic quantity — for POT (the
plan's transport cost, ``sinkhorn2``) and geomloss (debias=False: the regularised value ⟨α,f⟩+⟨β,g⟩ of
eq. 1) that is otfed's converged value, and for otfed it is POT's ``sinkhorn_log`` run to convergence
(numItermax 1e5, stopThr 1e-12) on the first ``--reference-pairs`` pairs.

    python -m bench.distill_speed                      # defaults above (≈5 min)
    python -m bench.distill_speed --eps 1e-3 --batch 256 --per-pair 64
    python -m bench.distill_speed --convergence-sweep --seeds 0 1 2   # solver robustness grid

Results: reports/bench/distill_loss.csv (and .md); the sweep writes reports/bench/distill_convergence.csv:
for each seed, SA/ERC/NLI costs, ε ∈ {1e-1, 1e-2, 3e-3, 1e-3} and six kinds of histogram pairs
(Dirichlet 1, 0.1, 0.03; softmax of N(0, 5²) logits; near-identical pairs, μ = ν·exp(1e-3·N(0,1))
renormalised; one-hot students), 256 × 6 pairs each: the number of pairs whose marginal error stayed
above the tolerance, the solver's steps and the time. The training-step benchmark against KL with a
model is ``bench/distill_step.py``.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from otfed import io
from otfed.device import pin_torch_threads
from otfed.label_space import LabelSpace
from otfed.ot import entropic_histogram_transport

OUT = Path("reports/bench")
SWEEP_EPS = (1e-1, 1e-2, 3e-3, 1e-3)


def timed(fn, repeats: int) -> tuple[float, object]:
    """(median seconds over ``repeats`` runs after one warm-up, last result)."""
    result = fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def exact_w1_line(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """W1 between histograms on the unit-spaced line: Σ_l |F_p(l) − F_q(l)| (B×K)."""
    return (torch.cumsum(p[:, None, :].double(), -1) - torch.cumsum(q.double(), -1)).abs()[..., :-1].sum(-1)


def sweep_histograms(kind: str, n: int, B: int, K: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(student B×n, teachers B×K×n) float64 histograms of one kind of the convergence sweep."""
    def dirichlet(alpha, shape):
        return torch.as_tensor(rng.dirichlet(np.full(n, alpha), size=shape))

    def softmax_logits(shape):
        return torch.softmax(torch.as_tensor(5 * rng.standard_normal((*shape, n))), -1)

    if kind.startswith("dirichlet"):
        alpha = float(kind.removeprefix("dirichlet"))
        return dirichlet(alpha, (B,)), dirichlet(alpha, (B, K))
    if kind == "logits":
        return softmax_logits((B,)), softmax_logits((B, K))
    if kind == "near":
        q = dirichlet(1.0, (B, K))
        p = q[:, 0] * torch.as_tensor(np.exp(1e-3 * rng.standard_normal((B, n))))
        return p / p.sum(-1, keepdim=True), q
    if kind == "onehot":
        return torch.as_tensor(np.eye(n)[rng.integers(n, size=B)]), dirichlet(1.0, (B, K))
    raise ValueError(f"unknown kind of histograms {kind!r}")


def convergence_sweep(seeds: list[int], out: Path) -> int:
    """Run the solver on the robustness grid (module docstring) and write distill_convergence.csv."""
    rows = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        for task in ("sa", "erc", "nli"):
            C = LabelSpace.for_task(task).cost_matrix()
            for kind in ("dirichlet1", "dirichlet0.1", "dirichlet0.03", "logits", "near", "onehot"):
                p, q = sweep_histograms(kind, C.shape[0], 256, 6, rng)
                for eps in SWEEP_EPS:
                    start = time.perf_counter()
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        r = entropic_histogram_transport(p.float(), q.float(), C, eps)
                    rows.append(dict(seed=seed, task=task, histograms=kind, eps=eps, pairs=q.shape[0] * q.shape[1],
                                     unconverged=int((r.marginal_error > r.tol).sum()),
                                     worst_marginal_error=float(r.marginal_error.max()), steps=r.n_steps,
                                     seconds=time.perf_counter() - start))
                    print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                   for k, v in rows[-1].items()), flush=True)
    table = pd.DataFrame(rows)
    print(f"unconverged pairs: {int(table.unconverged.sum())} of {int(table.pairs.sum())}; "
          f"total {table.seconds.sum():.1f} s; median per 1536 pairs by eps: "
          + ", ".join(f"{e:g}: {s:.3f} s" for e, s in table.groupby("eps").seconds.median().items()))
    io.write_csv(table, out / "distill_convergence.csv")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--teachers", type=int, default=6)
    parser.add_argument("--eps", type=float, nargs="+", default=[1e-3, 1e-2, 1e-1])
    parser.add_argument("--per-pair", type=int, default=256, help="pairs timed in the per-pair loops")
    parser.add_argument("--reference-pairs", type=int, default=64,
                        help="pairs solved by POT to convergence, the reference for otfed's entropic values")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--convergence-sweep", action="store_true", help="run the robustness grid instead")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds of the convergence sweep")
    args = parser.parse_args(argv)
    pin_torch_threads(args.threads)
    if args.convergence_sweep:
        return convergence_sweep(args.seeds, args.out)

    import geomloss
    import ot

    space = LabelSpace.for_task("sa")
    C = space.cost_matrix()
    g = torch.Generator().manual_seed(args.seed)
    B, K, n = args.batch, args.teachers, space.n_labels
    p = torch.softmax(3 * torch.randn(B, n, generator=g), -1)  # float32, as in training
    q = torch.softmax(3 * torch.randn(B, K, n, generator=g), -1)
    pairs = B * K
    # float64 copies renormalised exactly: POT's and geomloss's marginal constraints need equal masses
    # (float32 softmax outputs sum to 1 only within ~1e-7; otfed renormalises internally)
    p64, q64 = p.double() / p.double().sum(-1, keepdim=True), q.double() / q.double().sum(-1, keepdim=True)
    exact = exact_w1_line(p64, q64).reshape(-1)
    m = min(args.per_pair, pairs)
    pair_index = [(i // K, i % K) for i in range(m)]
    pn, qn, Cn = p64.numpy(), q64.numpy(), C.numpy()
    points = space.coordinates.float()
    rows: list[dict] = []

    for eps in args.eps:
        with torch.no_grad():  # the converged entropic values in float64 (checked against POT below)
            truth = entropic_histogram_transport(p64, q64, C, eps)
        entropic = {"transport": truth.cost.double().reshape(-1), "regularized": truth.regularized.double().reshape(-1)}

        def record(method, seconds, values, timed_pairs, quantity, converged=None, note="", vs_entropic=None):
            values = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
            k = values.numel()
            error = (values - exact[:k]).abs()
            if vs_entropic is None:
                vs_entropic = float((values - entropic[quantity][:k]).abs().max())
            rows.append(dict(eps=eps, method=method, pairs=pairs, pairs_timed=timed_pairs,
                             seconds=seconds * pairs / timed_pairs, extrapolated=timed_pairs < pairs,
                             value=quantity, max_abs_error_vs_w1=float(error.max()),
                             mean_abs_error_vs_w1=float(error.mean()),
                             max_abs_error_vs_entropic=vs_entropic,
                             converged_fraction=converged, note=note))
            print(f"eps={eps:<6g} {method:<46} {rows[-1]['seconds']:9.3f} s"
                  f"{' (extrapolated)' if timed_pairs < pairs else '               '}"
                  f"   max |err| vs W1 {rows[-1]['max_abs_error_vs_w1']:.2e}"
                  f"   vs entropic {rows[-1]['max_abs_error_vs_entropic']:.2e}", flush=True)

        # POT run to convergence on a few pairs: the independent reference for otfed's values
        k_ref = min(args.reference_pairs, pairs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reference = torch.tensor([float(ot.sinkhorn2(pn[i // K], qn[i // K, i % K], Cn, eps, method="sinkhorn_log",
                                                         numItermax=100_000, stopThr=1e-12))
                                      for i in range(k_ref)], dtype=torch.float64)
        otfed_vs_pot = float((entropic["transport"][:k_ref] - reference).abs().max())
        ref_note = f"vs POT run to convergence on {k_ref} pairs: {otfed_vs_pot:.1e}"

        # otfed: batched, forward only and forward + backward (the loss's default: one intra-op thread)
        def otfed_forward():
            with torch.no_grad():
                return entropic_histogram_transport(p, q, C, eps)

        seconds, result = timed(otfed_forward, args.repeats)
        record("otfed newton, batched, fwd", seconds, result.cost, pairs, "transport",
               float((result.marginal_error <= result.tol).double().mean()), ref_note, otfed_vs_pot)
        rows[-1]["solver_steps"] = result.n_steps

        def otfed_backward():
            x = p.clone().requires_grad_(True)
            r = entropic_histogram_transport(x, q, C, eps)
            r.cost.sum().backward()
            return r

        seconds, result = timed(otfed_backward, args.repeats)
        record("otfed newton, batched, fwd+bwd", seconds, result.cost.detach(), pairs, "transport",
               float((result.marginal_error <= result.tol).double().mean()), ref_note, otfed_vs_pot)

        if eps == min(args.eps):
            def otfed_sinkhorn():
                with warnings.catch_warnings(), torch.no_grad():
                    warnings.simplefilter("ignore")
                    return entropic_histogram_transport(p, q, C, eps, n_iter=300, solver="sinkhorn")

            seconds, result = timed(otfed_sinkhorn, args.repeats)
            record("otfed plain sinkhorn (300 it.), batched, fwd", seconds, result.cost, pairs, "transport",
                   float((result.marginal_error <= result.tol).double().mean()), "papers' Algorithm 1 + ε-scaling")

        # POT, one call per pair (numpy, float64, log-domain: the plain kernel underflows at ε = 1e-3)
        def pot_loop():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return [ot.sinkhorn2(pn[b], qn[b, k], Cn, eps, method="sinkhorn_log") for b, k in pair_index]

        seconds, values = timed(pot_loop, 1)
        record("POT sinkhorn2 sinkhorn_log, per pair, fwd", seconds, values, m, "transport", None,
               "numItermax 1000, stopThr 1e-9 (defaults)")

        # geomloss (the authors' choice): per pair and batched, debias False (value ⟨α,f⟩+⟨β,g⟩ = eq. 1)
        for scaling in (0.5, 0.9):
            loss = geomloss.SamplesLoss("sinkhorn", p=1, blur=eps, scaling=scaling, debias=False,
                                        backend="tensorized")
            pf, qf = p64.float(), q64.float()

            def geomloss_loop():
                return [float(loss(pf[b], points, qf[b, k], points)) for b, k in pair_index]

            seconds, values = timed(geomloss_loop, 1)
            record(f"geomloss scaling {scaling}, per pair, fwd", seconds, values, m, "regularized", None,
                   "debias=False: value ⟨α,f⟩+⟨β,g⟩")

            alpha = pf[:, None, :].expand(B, K, n).reshape(pairs, n).contiguous()
            beta = qf.reshape(pairs, n)
            xs = points.expand(pairs, n, points.shape[1]).contiguous()

            def geomloss_batched():
                with torch.no_grad():
                    return loss(alpha, xs, beta, xs)

            seconds, values = timed(geomloss_batched, args.repeats)
            record(f"geomloss scaling {scaling}, batched, fwd", seconds, values, pairs, "regularized", None,
                   "authors' call" if scaling == 0.5 else "")

            def geomloss_batched_backward():
                a = alpha.clone().requires_grad_(True)
                value = loss(a, xs, beta, xs)
                value.sum().backward()
                return value.detach()

            seconds, values = timed(geomloss_batched_backward, args.repeats)
            record(f"geomloss scaling {scaling}, batched, fwd+bwd", seconds, values, pairs, "regularized")

    table = pd.DataFrame(rows)
    base = table[table.method == "otfed newton, batched, fwd+bwd"].set_index("eps").seconds
    table["time_ratio_vs_otfed_fwd_bwd"] = table.seconds / table.eps.map(base)
    table.insert(0, "setting", f"B={B} K={K} C={n} threads={args.threads}")
    print()
    print(table[["eps", "method", "seconds", "time_ratio_vs_otfed_fwd_bwd", "max_abs_error_vs_w1",
                 "max_abs_error_vs_entropic"]].to_string(index=False))
    io.write_csv(table, args.out / "distill_loss.csv")
    io.write_text(io.markdown_table(table), args.out / "distill_loss.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
