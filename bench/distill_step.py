"""Benchmark: one KNOT distillation training step with the Sinkhorn loss vs the KL ("Entropy") loss.

Issue 4's goal: **one distillation training step (student forward, eq. 3 loss over all teachers,
backward, optimizer step) with the Sinkhorn loss costs ≤ 1.3× the same step with the KL loss** at
batch 256 with the default model.

Setting (defaults): the default student shape — ``transformers.BertForSequenceClassification`` from
``BertConfig(vocab_size=8000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
intermediate_size=512, max_position_embeddings=512)``, 5 labels — built here directly from
``transformers`` (randomly initialised, train mode, so dropout is on), random token ids of length 128;
batch B = 256; K = 6 teachers with Dirichlet(1) histograms; SA's label cost |i − j| on 1..5
(``LabelSpace.for_task("sa")``); Adam; unit teacher weights ("A", normalised); a fixed seed. Torch's
thread count is left at its default (both cores here) unless ``--threads`` is given. The loss kinds
(KL, and Sinkhorn at every ``--eps``) are interleaved in one process: each round runs one step of
every kind, in an order rotated from round to round, so load from other processes on the shared
machine hits them alike; after ``--warmup`` rounds, ``--repeats`` rounds are timed and the median is
reported (with the min and max). Each step is split into its parts (model forward, loss forward,
backward, optimizer step) with ``time.perf_counter`` (CPU: operations are synchronous).

    python -m bench.distill_step                  # defaults above (≈4 min on the 2 shared cores here)
    python -m bench.distill_step --eps 0.01 --repeats 15

Results: reports/bench/distill_step.csv (and .md, with a summary line): per kind and ε the median step
time (min, max) and its parts, and the Sinkhorn step's cost relative to the KL step three ways — the
ratio of the medians; the median of the ratios within a round (slow drifts of the load cancel); and
1 + (extra loss time)/(KL step), since the model's forward, backward and optimizer step are the same
work for both losses (the Sinkhorn loss's backward is one multiply-and-sum) — plus the solver's step
count and convergence on the final student predictions. The load average is recorded before and
after: above the number of cores, other processes shared them and step times swing between rounds.
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
from otfed.device import pin_torch_threads
from otfed.distill import ensemble_loss
from otfed.label_space import LabelSpace
from otfed.ot import entropic_histogram_transport

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
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--teachers", type=int, default=6)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--eps", type=float, nargs="+", default=[1e-1, 1e-2, 1e-3])
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--repeats", type=int, default=9, help="timed rounds (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.threads is not None:
        pin_torch_threads(args.threads)

    space = LabelSpace.for_task("sa")
    cost = space.cost_matrix()
    n = space.n_labels
    B, K = args.batch, args.teachers
    model = default_student(n, args.seed)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(args.seed)
    input_ids = torch.randint(0, 8000, (B, args.seq_len), generator=g)
    attention_mask = torch.ones_like(input_ids)
    teachers = _dirichlet(B, K, n, g)

    kinds = [("kl", None)] + [("sinkhorn", eps) for eps in args.eps]
    times: dict[tuple[str, float | None], list[dict]] = {k: [] for k in kinds}
    solver: dict[tuple[str, float | None], dict] = {}

    def step(kind: str, eps: float | None) -> dict:
        parts = {}
        optimizer.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        student = torch.softmax(logits, -1)
        t1 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss = ensemble_loss(student, teachers, kind=kind, cost=cost, eps=eps)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        optimizer.step()
        t4 = time.perf_counter()
        parts.update(forward=t1 - t0, loss=t2 - t1, backward=t3 - t2, optimizer=t4 - t3, step=t4 - t0)
        return parts

    load_before = os.getloadavg()
    print(f"threads={torch.get_num_threads()} load average before: {load_before}", flush=True)
    rounds = args.warmup + args.repeats
    for r in range(rounds):
        order = kinds[r % len(kinds):] + kinds[: r % len(kinds)]
        for kind, eps in order:
            parts = step(kind, eps)
            if r >= args.warmup:
                times[(kind, eps)].append(parts)
        print(f"round {r + 1}/{rounds}: " + "  ".join(
            f"{k}{'' if e is None else f'@{e:g}'} {times[(k, e)][-1]['step']:.3f}s" if r >= args.warmup else "warm-up"
            for k, e in kinds[:1 if r < args.warmup else len(kinds)]), flush=True)
    load_after = os.getloadavg()
    print(f"load average after: {load_after}", flush=True)

    # solver statistics at each ε on the last student predictions (no timing)
    with torch.no_grad():
        student = torch.softmax(model(input_ids=input_ids, attention_mask=attention_mask).logits, -1)
    for kind, eps in kinds:
        if kind == "sinkhorn":
            r = entropic_histogram_transport(student, teachers, cost, eps)
            solver[(kind, eps)] = dict(solver_steps=r.n_steps, converged=r.converged,
                                       worst_marginal_error=float(r.marginal_error.max()))

    rows = []
    kl = times[("kl", None)]
    kl_median = statistics.median(t["step"] for t in kl)
    for kind, eps in kinds:
        these = times[(kind, eps)]
        steps = [t["step"] for t in these]
        row = dict(kind=kind, eps=eps, repeats=len(steps), step_median_s=statistics.median(steps),
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
    table = pd.DataFrame(rows)
    setting = (f"B={B} K={K} C={n} seq={args.seq_len} threads={torch.get_num_threads()} "
               f"load_before={load_before[0]:.2f} load_after={load_after[0]:.2f}")
    table.insert(0, "setting", setting)
    print()
    print(table.drop(columns="setting").to_string(index=False))
    sinkhorn = table[table.kind == "sinkhorn"]
    summary = (
        "# Distillation training step: Sinkhorn vs KL loss (issue 4 goal: ≤ 1.3× the KL step)\n\n"
        f"Setting: {setting}; default BERT-tiny-shaped student, forward + eq. 3 loss over K teachers + "
        f"backward + Adam step; {args.repeats} timed rounds after {args.warmup} warm-up rounds, kinds "
        "interleaved (`python -m bench.distill_step`).\n\n"
        f"KL step median {kl_median:.3f} s. Sinkhorn step / KL step — ratio of medians: "
        + ", ".join(f"ε={e:g} {r:.2f}" for e, r in zip(sinkhorn.eps, sinkhorn.ratio_vs_kl))
        + "; median of same-round ratios: "
        + ", ".join(f"ε={e:g} {r:.2f}" for e, r in zip(sinkhorn.eps, sinkhorn.paired_ratio_median))
        + "; from the loss's own time (forward/backward/optimizer are the same work for both): "
        + ", ".join(f"ε={e:g} {r:.3f} (+{o:.3f} s)" for e, r, o in
                    zip(sinkhorn.eps, sinkhorn.ratio_from_loss_overhead, sinkhorn.loss_overhead_s))
        + ".\n\nA load average above the 2 cores means other processes shared them: step times then swing by "
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
