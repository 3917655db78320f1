"""FedWaD's error vs S, d and n, next to Gelbrich's lower bound and the exact W2 — the measurement behind the S rule
in :class:`otfed.federation.fedwad.FedWaDConfig`'s docstring.

Two clouds of n points, N(0, I) vs N(m, 1.5² I) with ‖m‖ = 2, data seed 100 + d + n, FedWaD seed 0, K = 20,
approximate interpolation, solver "auto"; exact W2 by POT's network simplex. One CSV row per (d, n, S) on stdout.

    python -m studies.fedwad_support_rule 2,5,50 500,2000 10,100,n > reports/studies/fedwad_support_rule.csv

The committed CSV is that command's output (minus its wall-time column; S = n at n = 2,000 took 25–82 s per run on the 2-core development machine).
"""
import sys
import numpy as np
import ot
from otfed.federation.fedwad import FedWaDConfig, federated_wasserstein
from otfed.ot import Measure
from otfed.ot.gelbrich import gelbrich_bound, measure_moments

def clouds(n, d, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    shift = np.full(d, 2.0 / np.sqrt(d))           # ||m1 - m2|| = 2
    y = rng.standard_normal((n, d)) * 1.5 + shift  # and a scale change
    return x, y

def exact(x, y):
    return float(np.sqrt(ot.emd2(ot.unif(len(x)), ot.unif(len(y)), ot.dist(x, y), numItermax=10**8)))

ds = [int(a) for a in sys.argv[1].split(",")]
ns = [int(a) for a in sys.argv[2].split(",")]
Ss = sys.argv[3].split(",")
print("d,n,S,K,exact,lower,upper,upper/exact-1,exact/lower-1,upper/lower", flush=True)
for d in ds:
    for n in ns:
        x, y = clouds(n, d, seed=100 + d + n)
        w = exact(x, y)
        lo = gelbrich_bound(*measure_moments(Measure.uniform(x)), *measure_moments(Measure.uniform(y)))
        for s in Ss:
            S = n if s == "n" else int(s)
            up = federated_wasserstein(x, y, FedWaDConfig(support_size=S), seed=0).estimate
            print(f"{d},{n},{S},20,{w:.4f},{lo:.4f},{up:.4f},{up/w-1:+.3f},{w/lo-1:+.3f},{up/lo:.3f}", flush=True)
