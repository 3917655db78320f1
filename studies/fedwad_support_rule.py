"""FedWaD's error vs S, d and the two clients' sizes n and m, next to Gelbrich's lower bound and the exact W2 — the
measurement behind the support rule in :class:`otfed.federation.fedwad.FedWaDConfig`'s docstring: S a multiple of
both sizes (lcm(n, m); max(n, m) where the smaller divides the larger), not the smaller client's size.

Two clouds, n points of N(0, I) (client μ) and m points of N(m₀, 1.5² I) with ‖m₀‖ = 2 (client ν), drawn in that
order from data seed 100 + d + n + 10⁶ · seed (seed 0 and m = n: the clouds of the equal-size table); FedWaD seed
``seed``, approximate interpolation, solver "auto", Gelbrich's lower bound on (the defaults); exact W2 by POT's
network simplex (``ot.emd2``, its convergence flag checked). One CSV row per (d, n:m, seed, S, K) on stdout.

Arguments: dimensions; client sizes (``n`` for n = m, or ``n:m``); supports (integers, or ``min`` / ``max`` / ``n``
— the smaller client's, the larger client's, client μ's size — or ``lcm``: the least common multiple of n and m,
skipped above 4 · max(n, m)); optionally seeds (default 0) and iteration counts K (default 20). The committed
reports are these commands' outputs:

    python -m studies.fedwad_support_rule 2,5,50 500,2000 10,100,n > reports/studies/fedwad_support_rule.csv
    python -m studies.fedwad_support_rule 2,5,50 600:200,600:240,600:400,600:60,200:600 min,300,max 0,1 \
        > reports/studies/fedwad_support_rule_sizes.csv
    python -m studies.fedwad_support_rule 5,50 300:200,300:120 min,max,lcm 0,1 20,60 \
        > reports/studies/fedwad_support_rule_lcm.csv

Columns: rule_met (:func:`~otfed.federation.fedwad.support_rule_met`); warned — the RuntimeWarnings the run raised
("support": the rule not met, "bracket": upper > 1.25 · lower + 0.05 · spread, "other"). No wall time (the same
arguments give the same bytes): on the shared 2-core development machine the second command took 19 minutes, the
third 6, and S = n at n = 2,000 took 25–82 s per run.
"""
from __future__ import annotations

import itertools
import math
import sys
import warnings

import numpy as np
import ot

from otfed.federation.fedwad import FedWaDConfig, federated_wasserstein, support_rule_met
from otfed.ot import Measure
from otfed.ot.gelbrich import gelbrich_bound, measure_moments

HEADER = "d,n,m,S,K,seed,exact,lower,upper,upper/exact-1,exact/lower-1,upper/lower,rule_met,warned"


def clouds(n: int, m: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n points of N(0, I) and m points of N(m₀, 1.5² I), ‖m₀‖ = 2, from ``seed``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    shift = np.full(d, 2.0 / np.sqrt(d))           # ||m1 - m2|| = 2
    y = rng.standard_normal((m, d)) * 1.5 + shift  # and a scale change
    return x, y


def exact_w2(x: np.ndarray, y: np.ndarray) -> float:
    """W2 between the two uniform empirical measures by POT's network simplex (raises if it did not converge)."""
    cost, log = ot.emd2(ot.unif(len(x)), ot.unif(len(y)), ot.dist(x, y), numItermax=10**8, log=True)
    if log["warning"] is not None:
        raise RuntimeError(f"ot.emd2 did not converge on {len(x)}×{len(y)}: {log['warning']}")
    return float(np.sqrt(cost))


def support(token: str, n: int, m: int) -> int | None:
    """The S a token asks for at sizes n, m (None: skipped)."""
    if token == "min":
        return min(n, m)
    if token == "max":
        return max(n, m)
    if token == "n":
        return n
    if token == "lcm":
        s = math.lcm(n, m)
        return s if s <= 4 * max(n, m) else None
    return int(token)


def warning_kind(text: str) -> str:
    """Which FedWaD warning a RuntimeWarning's text is."""
    return "support" if "support rule" in text else "bracket" if "Gelbrich" in text else "other"


def sizes(token: str) -> tuple[int, int]:
    n, _, m = token.partition(":")
    return int(n), int(m or n)


def main(argv: list[str]) -> None:
    ds = [int(a) for a in argv[0].split(",")]
    pairs = [sizes(a) for a in argv[1].split(",")]
    tokens = argv[2].split(",")
    seeds = [int(a) for a in argv[3].split(",")] if len(argv) > 3 else [0]
    iterations = [int(a) for a in argv[4].split(",")] if len(argv) > 4 else [20]
    print(HEADER, flush=True)
    for d in ds:
        for n, m in pairs:
            for seed in seeds:
                x, y = clouds(n, m, d, seed=100 + d + n + 10**6 * seed)
                w = exact_w2(x, y)
                lo = gelbrich_bound(*measure_moments(Measure.uniform(x)), *measure_moments(Measure.uniform(y)))
                for s, k in itertools.product(dict.fromkeys(support(t, n, m) for t in tokens), iterations):
                    if s is None:
                        continue
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        up = federated_wasserstein(x, y, FedWaDConfig(support_size=s, iterations=k),
                                                   seed=seed).estimate
                    kinds = sorted({warning_kind(str(c.message)) for c in caught
                                    if issubclass(c.category, RuntimeWarning)})
                    print(f"{d},{n},{m},{s},{k},{seed},{w:.4f},{lo:.4f},{up:.4f},{up / w - 1:+.4f},{w / lo - 1:+.3f},"
                          f"{up / lo:.3f},{support_rule_met(s, n, m)},{'+'.join(kinds) or 'none'}",
                          flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
