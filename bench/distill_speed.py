"""Benchmark: the KNOT Sinkhorn loss alone (no model) for a transfer batch of B samples × K teachers × C
labels — otfed's batched solver vs POT's ``ot.sinkhorn2`` called per (sample, teacher) pair vs geomloss
``SamplesLoss("sinkhorn", p=1, blur=ε, backend="tensorized")`` called per pair and batched (the
authors' code calls geomloss batched with its default ε-scaling 0.5 and debias=False).

Setting (defaults): B = 1024, K = 6, C = 5 SA labels on the line 1..5 (cost |i − j|), ε = 1e-3 (the
papers' value), histograms = softmax of N(0, 3²) logits, float32 inputs as in training; one torch/BLAS
thread (the machine is shared). Every method runs in the same process, side by side; times are medians
of ``--repeats`` runs after a warm-up. The per-pair loops (POT, geomloss per pair) are timed on the
first ``--per-pair`` pairs and extrapolated linearly to all B·K pairs (marked in the table). Accuracy
is measured against the exact W1, which on SA's unit-spaced line has the closed form Σ_l |F_μ(l) − F_ν(l)|.

    python -m bench.distill_speed                      # defaults above (≈1.5 min)
    python -m bench.distill_speed --batch 256 --per-pair 64
    python -m bench.distill_speed --convergence-sweep  # solver robustness grid (≈1.5 min)

Results: reports/bench/distill_loss.csv (and .md); the sweep writes reports/bench/distill_convergence.csv:
for SA/ERC/NLI costs, ε ∈ {1e-2, 3e-3, 1e-3} and six kinds of histogram pairs (Dirichlet 1, 0.1, 0.03;
softmax of N(0, 5²) logits; near-identical pairs, μ = ν·exp(1e-3·N(0,1)) renormalised; one-hot students),
256 × 6 pairs each, the number of pairs whose marginal error stayed above the tolerance. The training-step benchmark against KL with a model
comes with the model code.
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
from otfed.distill import LabelSpace, entropic_histogram_transport

OUT = Path("reports/bench")


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


def convergence_sweep(seed: int, out: Path) -> int:
    """Run the solver on the robustness grid (module docstring) and write distill_convergence.csv."""
    rng = np.random.default_rng(seed)
    rows = []
    for task in ("sa", "erc", "nli"):
        C = LabelSpace.for_task(task).cost_matrix()
        for kind in ("dirichlet1", "dirichlet0.1", "dirichlet0.03", "logits", "near", "onehot"):
            p, q = sweep_histograms(kind, C.shape[0], 256, 6, rng)
            for eps in (1e-2, 3e-3, 1e-3):
                start = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    r = entropic_histogram_transport(p.float(), q.float(), C, eps)
                rows.append(dict(task=task, histograms=kind, eps=eps, pairs=q.shape[0] * q.shape[1],
                                 unconverged=int((r.marginal_error > r.tol).sum()),
                                 worst_marginal_error=float(r.marginal_error.max()), steps=r.n_steps,
                                 seconds=time.perf_counter() - start))
                print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in rows[-1].items()),
                      flush=True)
    table = pd.DataFrame(rows)
    print(f"unconverged pairs: {int(table.unconverged.sum())} of {int(table.pairs.sum())}")
    io.write_csv(table, out / "distill_convergence.csv")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--teachers", type=int, default=6)
    parser.add_argument("--eps", type=float, default=1e-3)
    parser.add_argument("--per-pair", type=int, default=256, help="pairs timed in the per-pair loops")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--convergence-sweep", action="store_true", help="run the robustness grid instead")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.convergence_sweep:
        return convergence_sweep(args.seed, args.out)

    import geomloss
    import ot

    space = LabelSpace.for_task("sa")
    C = space.cost_matrix()
    g = torch.Generator().manual_seed(args.seed)
    B, K, n = args.batch, args.teachers, space.n_labels
    p = torch.softmax(3 * torch.randn(B, n, generator=g), -1)  # float32, as in training
    q = torch.softmax(3 * torch.randn(B, K, n, generator=g), -1)
    pairs = B * K
    exact = exact_w1_line(p, q)
    m = min(args.per_pair, pairs)
    pair_index = [(i // K, i % K) for i in range(m)]
    rows: list[dict] = []

    def record(method, seconds, values, timed_pairs, converged=None, note=""):
        values = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
        reference = exact.reshape(-1)[: values.numel()]
        error = (values - reference).abs()
        rows.append(dict(method=method, pairs=pairs, pairs_timed=timed_pairs,
                         seconds=seconds * pairs / timed_pairs, extrapolated=timed_pairs < pairs,
                         max_abs_error_vs_w1=float(error.max()), mean_abs_error_vs_w1=float(error.mean()),
                         converged_fraction=converged, note=note))
        print(f"{method:<44} {rows[-1]['seconds']:9.3f} s{' (extrapolated)' if timed_pairs < pairs else ''}"
              f"   max |err| vs W1 {rows[-1]['max_abs_error_vs_w1']:.2e}", flush=True)

    # otfed: batched, forward only and forward + backward
    def otfed_forward():
        with torch.no_grad():
            return entropic_histogram_transport(p, q, C, args.eps)

    seconds, result = timed(otfed_forward, args.repeats)
    record("otfed newton, batched, forward", seconds, result.cost, pairs,
           float((result.marginal_error <= result.tol).double().mean()))

    def otfed_backward():
        x = p.clone().requires_grad_(True)
        r = entropic_histogram_transport(x, q, C, args.eps)
        r.cost.sum().backward()
        return r

    seconds, result = timed(otfed_backward, args.repeats)
    record("otfed newton, batched, forward+backward", seconds, result.cost.detach(), pairs,
           float((result.marginal_error <= result.tol).double().mean()))

    def otfed_sinkhorn():
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            return entropic_histogram_transport(p, q, C, args.eps, n_iter=300, solver="sinkhorn")

    seconds, result = timed(otfed_sinkhorn, args.repeats)
    record("otfed plain sinkhorn (300 it.), batched, fwd", seconds, result.cost, pairs,
           float((result.marginal_error <= result.tol).double().mean()), "papers' Algorithm 1 + ε-scaling")

    # POT, one call per pair (numpy, float64, log-domain: the plain kernel underflows at ε = 1e-3)
    pn, qn, Cn = p.double().numpy(), q.double().numpy(), C.numpy()

    def pot_loop():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return [ot.sinkhorn2(pn[b], qn[b, k], Cn, args.eps, method="sinkhorn_log") for b, k in pair_index]

    seconds, values = timed(pot_loop, 1)
    record("POT sinkhorn2 sinkhorn_log, per pair, fwd", seconds * 1.0, values, m, None,
           "numItermax 1000 (default), stopThr 1e-9")

    # geomloss (the authors' choice): per pair and batched, default scaling 0.5, debias False
    points = space.coordinates.float()
    for scaling in (0.5, 0.9):
        loss = geomloss.SamplesLoss("sinkhorn", p=1, blur=args.eps, scaling=scaling, debias=False,
                                    backend="tensorized")

        def geomloss_loop():
            return [float(loss(p[b], points, q[b, k], points)) for b, k in pair_index]

        seconds, values = timed(geomloss_loop, 1)
        record(f"geomloss scaling {scaling}, per pair, fwd", seconds, values, m, None,
               "debias=False: value ⟨α,f⟩+⟨β,g⟩")

        alpha = p[:, None, :].expand(B, K, n).reshape(pairs, n).contiguous()
        beta = q.reshape(pairs, n)
        xs = points.expand(pairs, n, points.shape[1]).contiguous()

        def geomloss_batched():
            with torch.no_grad():
                return loss(alpha, xs, beta, xs)

        seconds, values = timed(geomloss_batched, args.repeats)
        record(f"geomloss scaling {scaling}, batched, fwd", seconds, values, pairs, None,
               "authors' call" if scaling == 0.5 else "")

        def geomloss_batched_backward():
            a = alpha.clone().requires_grad_(True)
            value = loss(a, xs, beta, xs)
            value.sum().backward()
            return value.detach()

        seconds, values = timed(geomloss_batched_backward, args.repeats)
        record(f"geomloss scaling {scaling}, batched, fwd+bwd", seconds, values, pairs)

    table = pd.DataFrame(rows)
    base = float(table.loc[table.method == "otfed newton, batched, forward", "seconds"].iloc[0])
    base_bwd = float(table.loc[table.method == "otfed newton, batched, forward+backward", "seconds"].iloc[0])
    table["time_ratio_vs_otfed_fwd"] = table.seconds / base
    table["time_ratio_vs_otfed_fwd_bwd"] = table.seconds / base_bwd
    table.insert(0, "setting", f"B={B} K={K} C={n} eps={args.eps:g} threads={args.threads}")
    print()
    print(table[["method", "seconds", "time_ratio_vs_otfed_fwd", "time_ratio_vs_otfed_fwd_bwd",
                 "max_abs_error_vs_w1"]].to_string(index=False))
    io.write_csv(table, args.out / "distill_loss.csv")
    io.write_text(io.markdown_table(table), args.out / "distill_loss.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
