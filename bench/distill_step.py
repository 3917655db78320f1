"""Benchmark: one KNOT distillation training step with the Sinkhorn loss vs the KL ("Entropy") loss.

Goal (issue 4, and issue 10 item 3 for the GPU): **one distillation training step (student forward,
eq. 3 loss over all teachers, backward, optimizer step) with the Sinkhorn loss costs ≤ 1.3× the same
step with the KL loss**, at batch 32 (the distill stage's batch size) and 256, on the CPU and on a GPU.

Setting (defaults): the default student shape — ``transformers.BertForSequenceClassification`` from
``BertConfig(vocab_size=8000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
intermediate_size=512, max_position_embeddings=512)``, 5 labels — built here directly from
``transformers`` (randomly initialised, train mode, so dropout is on), random token ids of length 128;
batch B ∈ {32, 256}; K = 6 teachers with Dirichlet(1) histograms; SA's label cost |i − j| on 1..5
(``LabelSpace.for_task("sa")``); Adam; unit teacher weights ("A", normalised); a fixed seed. The loss's
solver is the library's default (``--solver``; the distill stage passes none, so it uses the default),
solving on one thread on the CPU and with torch's setting on a GPU (``otfed.device.threads_for``, as
the distill stage). Torch's thread count is otherwise left at its default (both cores here) unless
``--threads`` is given. ``--device cuda`` runs model, data and loss on the GPU and synchronises the
device at the boundaries of each part of a step (so the parts are timed; the step is then timed
without the overlap of host and device across steps, alike for both losses). For each batch size the
loss kinds (KL, and Sinkhorn at every ``--eps``) are interleaved in one process: each round runs one
step of every kind, in an order rotated from round to round, so load from other processes on the
shared machine hits them alike; after ``--warmup`` rounds, ``--repeats`` rounds are timed and the median
is reported (with the min and max). Each step is split into its parts (model forward, loss forward,
backward, optimizer step) with ``time.perf_counter``.

    python -m bench.distill_step                  # CPU, defaults above (≈6 min on the 2 shared cores here)
    python -m bench.distill_step --device cuda    # on a GPU
    python -m bench.distill_step --batch 256 --eps 0.01 --repeats 15 --solver newton

Results: reports/bench/distill_step.csv (and .md, with a summary line per batch size): per batch size,
kind and ε the median step time (min, max) and its parts, and the Sinkhorn step's cost relative to the
KL step three ways — the ratio of the medians; the median of the ratios within a round (slow drifts of
the load cancel); and 1 + (extra loss time)/(KL step), since the model's forward, backward and
optimizer step are the same work for both losses (the Sinkhorn loss's backward is one multiply-and-sum)
— plus the solver, its step count and convergence on the final student predictions. The load average
is recorded before and after: above the number of cores, other processes shared them and step times
swing between rounds. The loss alone, by solver and against geomloss and POT, is
``bench/sinkhorn_backends.py``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from pathlib import Path

import pandas as pd
import torch

from otfed import io
from otfed.device import pin_torch_threads, threads_for
from otfed.distill import ensemble_loss
from otfed.label_space import LabelSpace
from otfed.ot import entropic_histogram_transport
from otfed.ot.entropic_histograms import DEFAULT_SOLVER, SOLVERS

OUT = Path("reports/bench")
PARTS = ("forward", "loss", "backward", "optimizer")


def default_student(n_labels: int, seed: int) -> torch.nn.Module:
    """The default BERT-tiny-shaped student (issue 4), randomly initialised from ``seed``."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=8000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=512, max_position_embeddings=512, num_labels=n_labels)
    torch.manual_seed(seed)
    return BertForSequenceClassification(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--teachers", type=int, default=6)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--eps", type=float, nargs="+", default=[1e-1, 1e-2, 1e-3])
    parser.add_argument("--solver", default=DEFAULT_SOLVER, choices=SOLVERS,
                        help="the Sinkhorn loss's solver (default: the library's, which the distill stage uses)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--repeats", type=int, default=9, help="timed rounds (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.threads is not None:
        pin_torch_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    threads = threads_for(args.device)  # the loss's solve: one thread on CPU, torch's setting on a GPU

    space = LabelSpace.for_task("sa")
    cost = space.cost_matrix().to(device)
    n = space.n_labels
    K = args.teachers
    model = default_student(n, args.seed).to(device)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    kinds = [("kl", None)] + [("sinkhorn", eps) for eps in args.eps]

    def synchronize():
        if cuda:
            torch.cuda.synchronize()

    load_before = os.getloadavg()
    print(f"device={args.device} solver={args.solver} threads={torch.get_num_threads()} "
          f"load average before: {load_before}", flush=True)
    rows = []
    for B in args.batch:
        g = torch.Generator().manual_seed(args.seed)
        input_ids = torch.randint(0, 8000, (B, args.seq_len), generator=g).to(device)
        attention_mask = torch.ones_like(input_ids)
        teachers = _dirichlet(B, K, n, g).to(device)
        times: dict[tuple[str, float | None], list[dict]] = {k: [] for k in kinds}

        def step(kind: str, eps: float | None) -> dict:
            optimizer.zero_grad(set_to_none=True)
            synchronize()
            t0 = time.perf_counter()
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
            student = torch.softmax(logits, -1)
            synchronize()
            t1 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                options = {} if kind == "kl" else {"cost": cost, "eps": eps, "solver": args.solver, "threads": threads}
                loss = ensemble_loss(student, teachers, kind=kind, **options)
            synchronize()
            t2 = time.perf_counter()
            loss.backward()
            synchronize()
            t3 = time.perf_counter()
            optimizer.step()
            synchronize()
            t4 = time.perf_counter()
            return dict(forward=t1 - t0, loss=t2 - t1, backward=t3 - t2, optimizer=t4 - t3, step=t4 - t0)

        rounds = args.warmup + args.repeats
        for r in range(rounds):
            order = kinds[r % len(kinds):] + kinds[: r % len(kinds)]
            for kind, eps in order:
                parts = step(kind, eps)
                if r >= args.warmup:
                    times[(kind, eps)].append(parts)
            print(f"B={B} round {r + 1}/{rounds}: " + "  ".join(
                f"{k}{'' if e is None else f'@{e:g}'} {times[(k, e)][-1]['step']:.3f}s" if r >= args.warmup
                else "warm-up" for k, e in kinds[:1 if r < args.warmup else len(kinds)]), flush=True)

        # solver statistics at each ε on the last student predictions (no timing)
        with torch.no_grad():
            student = torch.softmax(model(input_ids=input_ids, attention_mask=attention_mask).logits, -1)
        solver = {}
        for kind, eps in kinds:
            if kind == "sinkhorn":
                res = entropic_histogram_transport(student, teachers, cost, eps, solver=args.solver, threads=threads)
                solver[(kind, eps)] = dict(solver=args.solver, solver_steps=res.n_steps, converged=bool(res.converged),
                                           worst_marginal_error=float(res.marginal_error.max()))

        kl = times[("kl", None)]
        kl_median = statistics.median(t["step"] for t in kl)
        for kind, eps in kinds:
            these = times[(kind, eps)]
            steps = [t["step"] for t in these]
            row = dict(batch=B, kind=kind, eps=eps, repeats=len(steps), step_median_s=statistics.median(steps),
                       step_min_s=min(steps), step_max_s=max(steps))
            row["ratio_vs_kl"] = row["step_median_s"] / kl_median
            # the same round's KL step as the baseline (slow drifts of the machine's load cancel)
            row["paired_ratio_median"] = statistics.median(t["step"] / k["step"] for t, k in zip(these, kl))
            # the model's forward, backward and optimizer step are the same work for both losses: what the
            # Sinkhorn loss itself adds is its forward time (its backward is one multiply-and-sum)
            row["loss_overhead_s"] = statistics.median(t["loss"] - k["loss"] for t, k in zip(these, kl))
            row["ratio_from_loss_overhead"] = 1 + row["loss_overhead_s"] / kl_median
            for part in PARTS:
                row[f"{part}_median_s"] = statistics.median(t[part] for t in these)
            row.update(solver.get((kind, eps), {}))
            rows.append(row)
    load_after = os.getloadavg()
    print(f"load average after: {load_after}", flush=True)

    table = pd.DataFrame(rows)
    setting = (f"device={args.device} K={K} C={n} seq={args.seq_len} threads={torch.get_num_threads()} "
               f"solver={args.solver} load_before={load_before[0]:.2f} load_after={load_after[0]:.2f}")
    table.insert(0, "setting", setting)
    print()
    print(table.drop(columns="setting").to_string(index=False))
    lines = []
    for B in args.batch:
        t = table[table.batch == B]
        sinkhorn = t[t.kind == "sinkhorn"]
        lines.append(
            f"- **B={B}**: KL step median {float(t[t.kind == 'kl'].step_median_s.iloc[0]):.3f} s. Sinkhorn step / KL "
            "step — ratio of medians: "
            + ", ".join(f"ε={e:g} {r:.2f}" for e, r in zip(sinkhorn.eps, sinkhorn.ratio_vs_kl))
            + "; median of same-round ratios: "
            + ", ".join(f"ε={e:g} {r:.2f}" for e, r in zip(sinkhorn.eps, sinkhorn.paired_ratio_median))
            + "; from the loss's own time (forward/backward/optimizer are the same work for both): "
            + ", ".join(f"ε={e:g} {r:.3f} (+{o:.3f} s)" for e, r, o in
                        zip(sinkhorn.eps, sinkhorn.ratio_from_loss_overhead, sinkhorn.loss_overhead_s)) + ".")
    summary = (
        "# Distillation training step: Sinkhorn vs KL loss (goal: ≤ 1.3× the KL step at batch 32 and 256)\n\n"
        f"Setting: {setting}; default BERT-tiny-shaped student, forward + eq. 3 loss over K teachers + "
        f"backward + Adam step; {args.repeats} timed rounds after {args.warmup} warm-up rounds per batch size, "
        f"kinds interleaved (`python -m bench.distill_step --device {args.device}`).\n\n"
        + "\n".join(lines)
        + "\n\nA load average above the 2 cores means other processes shared them: step times then swing by "
        "tens of percent between rounds, whatever the loss.\n\n"
    )
    io.write_csv(table, args.out / "distill_step.csv")
    io.write_text(summary + io.markdown_table(table), args.out / "distill_step.md")
    return 0


def _dirichlet(B: int, K: int, n: int, generator: torch.Generator) -> torch.Tensor:
    """B×K×n Dirichlet(1) histograms (normalised exponentials) from ``generator``."""
    draws = -torch.log(torch.rand(B, K, n, generator=generator))
    return draws / draws.sum(-1, keepdim=True)


if __name__ == "__main__":
    raise SystemExit(main())
