"""Study: where can FedBary's table-4 effect (FashionMNIST 0.56 → 0.64 after removing flagged data) appear?

Stage ``noisy_removal`` finds that on its default data (5 FashionMNIST clients × 400, 10% noise on average)
removing noisy data does not help FedAvg — even removing exactly the noisy points (the oracle) gains nothing
measurable. This sweep asks whether the noise costs accuracy at all, and if so whether FedBary's removal wins
it back, as the noise grows and with the paper's 5,000 training samples.

Setting (stage ``noisy_removal``'s, read from ``params.yaml``: FedBary settings, FedAvg softmax regression
20 rounds × 5 epochs lr 0.1, budget candidates, 500 validation / 500 test rows, 256-D random projection,
feature-noise std of ``partition.federations.fmnist_feature_noise``): per seed, 5 clean class-stratified
FashionMNIST clients (``build_federation``, FedBary case 1: the samples of cases 4–5 before any corruption),
then noise planted in pixel space on each client's share r_k of its samples (labels flipped, or N(0, std²)
per pixel), r_k = case 4/5's 0/5/10/15/20% scaled so the average is the noise level (10, 30, 50%), each
capped at 90% (50% → 0/25/50/75/90%, average 48%); then the seeded Gaussian projection. Grid: noise kind
(label, feature) × level (10, 30, 50%) with 400 samples per client, plus 1,000 per client (all 5,000 rows
of ``data/raw/images_fashionmnist.npz``, the paper's size) at 10%. The server's validation and test rows
are the embedded file's 1,000 test rows (the paper had 1,000 + 1,000).

Per cell and seed, FedAvg test accuracy trained on (a) the clean samples, (b) the noisy samples, (c) the
noisy samples minus exactly the noisy ones (oracle), (d) minus FedBary's flagged data g > 0 (eq. 10),
(e) minus the largest-g share b of every client, b chosen by FedAvg's *validation* accuracy among the
budget candidates (ties → smaller b; b = 0 is (b)), (f) minus as many random data per client as (e);
plus the ROC AUC of g against the planted noise and how many (noisy) data each rule removed. The seed
draws the clients, the noise, the projection, FedBary, FedAvg's initialisation and the random removal;
every model of one seed starts from the same initialisation, so differences vs (b) are paired. Reported:
mean ± 95% CI (Student t) over the seeds. Nothing is tuned on the test set.

    python -m studies.removal_sweep            # full grid, 10 seeds (≈ 9 minutes on 2 cores)
    python -m studies.removal_sweep --quick    # 1 seed, 10% and 50% only, 400 per client: a timing check
Results: reports/studies/removal_sweep.csv (one row per cell and seed), .md (summary), .png.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from otfed import io
from otfed.data.corruption import case_noise_rates, plant_noise
from otfed.data.federations import FedBaryCaseFederation, build_federation
from otfed.data.parties import client_sets, n_classes_of, project_federation, server_split
from otfed.data.store import FederationData
from otfed.device import stage_device, threads_for
from otfed.federation.fedbary import FedBaryConfig, federated_valuation
from otfed.fl import FedAvgConfig, evaluate, fedavg_state
from otfed.metrics import mean_confidence_interval
from otfed.valuation import budget_removal, detection_auc, flagged_removal, random_removal

OUT = Path("reports/studies")
NAME = "removal_sweep"
DATASET = "fashionmnist"
N_CLIENTS = 5
LEVELS = (0.10, 0.30, 0.50)
KINDS = ("label", "feature")
MAX_CLIENT_SHARE = 0.90
DEFAULT_PER_CLIENT, PAPER_PER_CLIENT = 400, 1000
RULES = ("clean", "noisy", "oracle", "flagged", "budget", "random")  # (a)–(f)


@dataclasses.dataclass(frozen=True)
class Setting:
    """Stage ``noisy_removal``'s settings (params.yaml), as library types."""

    fedbary: FedBaryConfig
    fedavg: FedAvgConfig
    budgets: tuple[float, ...]
    max_remove_fraction: float
    validation_samples: int
    random_projection: int
    noise_std: float


def load_setting(path: str) -> Setting:
    """The ``noisy_removal`` group of ``path`` and the feature-noise std of its ``fmnist_feature_noise``."""
    p = yaml.safe_load(Path(path).read_text())
    nr = p["noisy_removal"]
    if nr.get("pca_components", 0):
        raise SystemExit(f"error: {path}: noisy_removal.pca_components must be 0 here (this study projects randomly)")
    return Setting(fedbary=FedBaryConfig(**nr["fedbary"]), fedavg=FedAvgConfig(**nr["fedavg"]),
                   budgets=tuple(sorted(nr["budgets"])), max_remove_fraction=float(nr["max_remove_fraction"]),
                   validation_samples=int(nr["validation_samples"]), random_projection=int(nr["random_projection"]),
                   noise_std=float(p["partition"]["federations"]["fmnist_feature_noise"].get("noise_std", 1.0)))


def client_noise_shares(level: float, n_clients: int = N_CLIENTS) -> np.ndarray:
    """FedBary cases 4–5's per-client shares (0/5/10/15/20% for 5 clients) scaled to average ``level``,
    each capped at ``MAX_CLIENT_SHARE``."""
    rates = case_noise_rates(n_clients)
    return np.minimum(rates * level / rates.mean(), MAX_CLIENT_SHARE)


def clean_federation(per_client: int, seed: int) -> FederationData:
    """5 class-stratified FashionMNIST clients of ``per_client`` samples (FedBary case 1, pixel features),
    the server's 1,000 test rows; drawn from ``seed``."""
    spec = FedBaryCaseFederation(scheme="fedbary_case", case=1, dataset=DATASET, n_clients=N_CLIENTS,
                                 samples_per_client=per_client, val_fraction=0.0)
    return build_federation(f"{NAME}_{per_client}", spec, "data/raw", seed)[0]


def noisy_federation(fed: FederationData, kind: str, shares: np.ndarray, noise_std: float,
                     seed: int) -> FederationData:
    """``fed`` with a share ``shares[k]`` of client k's rows corrupted (``plant_noise``: labels flipped or
    N(0, std²) pixel noise) and ``corrupted`` marking them; seeded by (seed, kind, shares)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, KINDS.index(kind), *np.round(shares * 1e4).astype(int)]))
    x, y, corrupted = fed.x.astype(np.float64), fed.y.copy(), np.zeros(len(fed.y), dtype=bool)
    n_classes = n_classes_of(fed.y, fed.y_test)
    for k, share in enumerate(shares):
        rows = fed.rows(k)
        x[rows], y[rows], corrupted[rows] = plant_noise(x[rows], y[rows], np.zeros(len(rows)), kind, float(share),
                                                        noise_std, n_classes, rng)
    return dataclasses.replace(fed, x=x.astype(np.float32), y=y, corrupted=corrupted)


class Trainer:
    """FedAvg (the setting's) on one federation's server data: (validation, test) accuracy of a model
    trained on given client data, from the initialisation ``seed`` draws."""

    def __init__(self, fed: FederationData, setting: Setting, seed: int, device: str) -> None:
        self.validation, self.test = server_split(fed, setting.validation_samples)
        self.n_classes = n_classes_of(fed.y, fed.y_test)
        self.setting, self.seed, self.device, self.threads = setting, seed, device, threads_for(device)

    def accuracies(self, clients: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float]:
        state = fedavg_state(clients, self.test[0].shape[1], self.n_classes, self.setting.fedavg, self.seed,
                             device=self.device, num_threads=self.threads)
        return tuple(evaluate(state, x, y, device=self.device, num_threads=self.threads)  # type: ignore[return-value]
                     for x, y in ((self.validation.x, self.validation.y), self.test))


def removal_cell(fed: FederationData, trainer: Trainer, setting: Setting, seed: int) -> dict[str, Any]:
    """Rules (b)–(f) on one noisy (projected) federation: test accuracies, the budget chosen on validation,
    removal counts, detection AUC and FedBary's seconds."""
    clients = client_sets(fed)
    noisy = [fed.corrupted[fed.rows(k)] for k in range(fed.n_clients)]
    start = time.perf_counter()
    res = federated_valuation(clients, setting.fedbary, validation=trainer.validation, seed=seed, datum_values=True,
                              potential=setting.fedbary.potential)
    fedbary_seconds = time.perf_counter() - start
    g = [res.datum_values[c.name] for c in clients]

    def kept(masks: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(c.x[~m], c.y[~m]) for c, m in zip(clients, masks)]

    budget = {b: [budget_removal(v, b) for v in g] for b in (0.0, *setting.budgets)}
    scores = {b: trainer.accuracies(kept(m)) for b, m in budget.items()}  # b = 0: nothing removed
    chosen = max(setting.budgets, key=lambda b: (scores[b][0], -b))
    masks = {"noisy": budget[0.0], "oracle": noisy, "budget": budget[chosen],
             "flagged": [flagged_removal(v, setting.max_remove_fraction) for v in g],
             "random": random_removal(budget[chosen], np.random.default_rng(np.random.SeedSequence([seed, 11])))}
    row: dict[str, Any] = dict(n_train=sum(len(m) for m in noisy), noisy=int(sum(m.sum() for m in noisy)),
                               auc=detection_auc(np.concatenate(g), np.concatenate(noisy)), budget=chosen)
    for rule, ms in masks.items():
        row[f"accuracy_{rule}"] = scores[chosen][1] if rule == "budget" else (
            scores[0.0][1] if rule == "noisy" else trainer.accuracies(kept(ms))[1])
        if rule != "noisy":
            row[f"removed_{rule}"] = int(sum(m.sum() for m in ms))
            row[f"removed_{rule}_noisy"] = int(sum((m & bad).sum() for m, bad in zip(ms, noisy)))
    row["fedbary_seconds"] = fedbary_seconds
    return row


def grid(quick: bool) -> list[tuple[int, str, float]]:
    """(samples per client, noise kind, level) cells: every level at 400 per client, 10% at 1,000."""
    levels = (LEVELS[0], LEVELS[-1]) if quick else LEVELS
    cells = [(DEFAULT_PER_CLIENT, kind, level) for kind in KINDS for level in levels]
    return cells if quick else cells + [(PAPER_PER_CLIENT, kind, LEVELS[0]) for kind in KINDS]


def run(cells: list[tuple[int, str, float]], setting: Setting, seeds: list[int], device: str) -> pd.DataFrame:
    """One row per (cell, seed); the clean model is trained once per (samples per client, seed)."""
    rows = []
    for seed in seeds:
        for per_client in sorted({c[0] for c in cells}):
            clean = clean_federation(per_client, seed)
            projected = project_federation(clean, 0, seed, setting.random_projection)
            trainer = Trainer(projected, setting, seed, device)
            clean_accuracy = trainer.accuracies([(c.x, c.y) for c in client_sets(projected)])[1]
            for _, kind, level in (c for c in cells if c[0] == per_client):
                start, load = time.perf_counter(), os.getloadavg()[0]
                shares = client_noise_shares(level)
                fed = project_federation(noisy_federation(clean, kind, shares, setting.noise_std, seed), 0, seed,
                                         setting.random_projection)
                row = dict(samples_per_client=per_client, kind=kind, level=level,
                           client_shares="/".join(f"{100 * s:g}" for s in shares), seed=seed,
                           accuracy_clean=clean_accuracy) | removal_cell(fed, trainer, setting, seed)
                row |= dict(seconds=time.perf_counter() - start, load_1min=load)
                rows.append(row)
                print(f"[{NAME}] n={N_CLIENTS * per_client} {kind} {level:.0%} seed {seed}: "
                      + " ".join(f"{r} {row[f'accuracy_{r}']:.3f}" for r in RULES)
                      + f" auc {row['auc']:.3f} budget {row['budget']:g} ({row['seconds']:.1f} s, load {load:.2f})",
                      flush=True)
    return pd.DataFrame(rows)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per cell over seeds: mean and 95% CI of every accuracy, of the paired gains vs (b) in accuracy
    points, of the AUC, budget and removal counts."""
    out = []
    for (per_client, kind, level), sub in table.groupby(["samples_per_client", "kind", "level"], sort=False):
        row: dict[str, Any] = dict(n_train=int(sub.n_train.iloc[0]), kind=kind, level=level,
                                   noisy=float(sub.noisy.mean()), seeds=len(sub))
        cols = {f"accuracy_{r}": sub[f"accuracy_{r}"] for r in RULES}
        cols |= {f"gain_{r}": 100 * (sub[f"accuracy_{r}"] - sub.accuracy_noisy) for r in RULES if r != "noisy"}
        cols |= {c: sub[c] for c in sub.columns if c.startswith("removed_")} | dict(auc=sub.auc, budget=sub.budget)
        for c, v in cols.items():
            row[c], row[f"{c}_ci95"] = mean_confidence_interval(v.to_numpy(dtype=np.float64))
        out.append(row)
    return pd.DataFrame(out)


def _pm(mean: float, ci: float, digits: int = 1, sign: bool = False) -> str:
    m = f"{mean:+.{digits}f}" if sign else f"{mean:.{digits}f}"
    return m if not np.isfinite(ci) else f"{m} ± {ci:.{digits}f}"


def _share(r: Any) -> str:
    return f"{r.kind} noise on {100 * r.noisy / r.n_train:.0f}% of {r.n_train}"


def _sign(mean: float, ci: float) -> str:
    """Whether a paired difference's 95% CI lies above 0, below 0 or around it."""
    return "> 0" if mean - ci > 0 else "< 0" if mean + ci < 0 else "includes 0"


def findings(s: pd.DataFrame) -> list[str]:
    """Plain sentences: where the noise costs accuracy (clean − noisy, CI above 0) and whether each removal
    wins it back; then one line per cell with the numbers."""
    costly = s[s.gain_clean - s.gain_clean_ci95 > 0]
    seeds = int(s.seeds.max())
    if len(costly):
        lines = [f"Noise costs accuracy (95% CI of clean − noisy above 0, {seeds} seeds) only in: "
                 + "; ".join(_share(r) for r in costly.itertuples()) + ". There, removal vs the noisy model: "
                 + "; ".join(f"{_share(r)}: oracle {_pm(r.gain_oracle, r.gain_oracle_ci95, sign=True)} (CI "
                             f"{_sign(r.gain_oracle, r.gain_oracle_ci95)}), FedBary budget "
                             f"{_pm(r.gain_budget, r.gain_budget_ci95, sign=True)} (CI {_sign(r.gain_budget, r.gain_budget_ci95)}),"
                             f" FedBary g > 0 {_pm(r.gain_flagged, r.gain_flagged_ci95, sign=True)} (CI "
                             f"{_sign(r.gain_flagged, r.gain_flagged_ci95)})" for r in costly.itertuples()) + "."]
    else:
        lines = [f"In no cell does the noise cost accuracy detectably ({seeds} seeds): nothing for removal to win back."]
    lines.append("In the other cells no cost is detectable over these seeds (CI of clean − noisy includes 0), so "
                 "removal has nothing measurable to win back." if len(costly) < len(s) else "")
    for r in s.itertuples():
        lines.append(f"- {_share(r)}: clean − noisy {_pm(r.gain_clean, r.gain_clean_ci95, sign=True)} points (CI "
                     f"{_sign(r.gain_clean, r.gain_clean_ci95)}); removal vs noisy: oracle "
                     f"{_pm(r.gain_oracle, r.gain_oracle_ci95, sign=True)}, FedBary budget "
                     f"{_pm(r.gain_budget, r.gain_budget_ci95, sign=True)}, FedBary g > 0 "
                     f"{_pm(r.gain_flagged, r.gain_flagged_ci95, sign=True)}, random "
                     f"{_pm(r.gain_random, r.gain_random_ci95, sign=True)}.")
    return lines


def markdown(s: pd.DataFrame, header: str) -> str:
    """The report: header, accuracies and paired gains, detection and removal counts, findings."""
    gains = pd.DataFrame({
        "n": s.n_train, "kind": s.kind, "noisy": [f"{n:.0f} ({100 * n / t:.0f}%)" for n, t in zip(s.noisy, s.n_train)],
        **{f"acc {r}": [_pm(100 * m, 100 * c) for m, c in zip(s[f"accuracy_{r}"], s[f"accuracy_{r}_ci95"])]
           for r in ("clean", "noisy")},
        **{f"Δ {r}": [_pm(m, c, sign=True) for m, c in zip(s[f"gain_{r}"], s[f"gain_{r}_ci95"])]
           for r in ("clean", "oracle", "flagged", "budget", "random")}})
    removal = pd.DataFrame({
        "n": s.n_train, "kind": s.kind, "noisy": s.noisy.round(0).astype(int),
        "AUC of g": [_pm(m, c, 3) for m, c in zip(s.auc, s.auc_ci95)],
        "g > 0 removed (noisy)": [f"{a:.0f} ({b:.0f})" for a, b in zip(s.removed_flagged, s.removed_flagged_noisy)],
        "budget b": [_pm(m, c, 3) for m, c in zip(s.budget, s.budget_ci95)],
        "budget removed (noisy)": [f"{a:.0f} ({b:.0f})" for a, b in zip(s.removed_budget, s.removed_budget_noisy)],
        "random removed (noisy)": [f"{a:.0f} ({b:.0f})" for a, b in zip(s.removed_random, s.removed_random_noisy)]})
    return (f"{header}\n\n## Test accuracy (%) and paired differences vs the noisy model (points)\n\n"
            "acc: mean ± 95% CI over seeds; Δ rule = accuracy(rule) − accuracy(noisy), same seed. clean = trained on "
            "the same samples before any noise (Δ clean = what the noise costs); oracle = the noisy data removed "
            "exactly; flagged = FedBary's g > 0; budget = FedBary's largest-g share, b chosen on validation; "
            f"random = as many random data as budget.\n\n{io.markdown_table(gains)}\n"
            "## Detection and removal (means over seeds)\n\n"
            f"{io.markdown_table(removal)}\n## Findings (generated from the numbers above)\n\n"
            + "\n".join(line for line in findings(s) if line) + "\n")


def figure(s: pd.DataFrame):
    """Test accuracy vs the average noisy share, one panel per noise kind; 1,000-per-client cells as open marks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"clean": ("k", "o"), "noisy": ("tab:red", "s"), "oracle": ("tab:green", "^"),
              "budget": ("tab:blue", "D"), "flagged": ("tab:orange", "v")}
    fig, axes = plt.subplots(1, len(KINDS), figsize=(11, 4), sharey=True)
    for ax, kind in zip(np.atleast_1d(axes), KINDS):
        for n, sub in s[s.kind == kind].groupby("n_train"):
            big = n != s.n_train.min()
            x = 100 * sub.noisy / sub.n_train + (1.0 if big else 0.0)  # open marks a little to the right
            for rule, (color, marker) in styles.items():
                ax.errorbar(x, 100 * sub[f"accuracy_{rule}"], yerr=100 * sub[f"accuracy_{rule}_ci95"].fillna(0),
                            color=color, marker=marker, ls="none" if big else "-", capsize=3,
                            mfc="none" if big else color, label=None if big else rule)
        ax.set(title=f"{kind} noise", xlabel="noisy share of the training data (%)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("FedAvg test accuracy (%), mean ± 95% CI")
    if s.n_train.nunique() > 1:
        axes[0].plot([], [], "ko", mfc="none", label=f"open marks: {int(s.n_train.max())} samples")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m studies.{NAME}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="first seed (seeds seed … seed+seeds−1)")
    parser.add_argument("--quick", action="store_true", help="1 seed, 10%% and 50%%, 400 per client only")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--device", default="cpu", help="FedAvg's device (cpu: one torch thread)")
    parser.add_argument("--out", type=Path, default=OUT, help="folder of the report files")
    args = parser.parse_args(argv)
    from threadpoolctl import threadpool_limits

    setting = load_setting(args.params)
    device = stage_device(args.device)  # on CPU: torch pinned to one thread
    seeds = list(range(args.seed, args.seed + (1 if args.quick else args.seeds)))
    cells = grid(args.quick)
    load_start, start = os.getloadavg(), time.perf_counter()
    with threadpool_limits(limits=1, user_api="blas"):  # FedBary's numpy on one core too
        table = run(cells, setting, seeds, device)
    wall, load_end = time.perf_counter() - start, os.getloadavg()
    s = summary(table)
    command = " ".join([f"python -m studies.{NAME}", *(argv if argv is not None else sys.argv[1:])])
    header = (f"# Where does noise cost FedAvg accuracy, and does FedBary's removal win it back?\n\n"
              f"`{command}` — {wall / 60:.1f} min on {os.cpu_count()} cores (torch and BLAS 1 thread, device "
              f"{device}); load average (1/5/15 min) {'/'.join(f'{v:.2f}' for v in load_start)} at the start, "
              f"{'/'.join(f'{v:.2f}' for v in load_end)} at the end. Seeds {seeds[0]}…{seeds[-1]}.\n\n"
              f"Setting: {N_CLIENTS} FashionMNIST clients, class-stratified; noise planted in pixel space on each "
              f"client's share of its data (FedBary cases 4–5's 0/5/10/15/20% scaled to the average level, capped at "
              f"{MAX_CLIENT_SHARE:.0%}: per-client shares {', '.join(sorted(set(table.client_shares)))}%); "
              f"feature noise N(0, {setting.noise_std:g}²) per pixel; {setting.random_projection}-D Gaussian random "
              f"projection; server validation {setting.validation_samples} / test "
              f"{1000 - setting.validation_samples} rows (the file's 1,000 test rows; the paper had 1,000 + 1,000). "
              f"FedBary S = {setting.fedbary.support_size}, K = {setting.fedbary.iterations}, potentials "
              f"{setting.fedbary.potential}; FedAvg softmax regression, {setting.fedavg.rounds} rounds × "
              f"{setting.fedavg.epochs} epochs, lr {setting.fedavg.lr:g}, full batch; budget candidates "
              f"{list(setting.budgets)} chosen on validation. n = {N_CLIENTS * PAPER_PER_CLIENT} uses all 5,000 "
              f"training rows of data/raw/images_fashionmnist.npz (the same samples in every seed; the seed redraws the "
              f"client split, the noise, the projection and the rest). Per-seed rows: {NAME}.csv; figure: {NAME}.png.")
    args.out.mkdir(parents=True, exist_ok=True)
    io.write_csv(table, args.out / f"{NAME}.csv")
    report = markdown(s, header)
    io.write_text(report, args.out / f"{NAME}.md")
    io.save_figure(figure(s), args.out / f"{NAME}.png")
    print(report)
    print(f"[{NAME}] {wall:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
