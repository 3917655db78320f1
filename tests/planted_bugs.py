"""Does ``make test-fast`` catch a bug in a core formula? ``python -m tests.planted_bugs`` plants one bug at a time
in a clone of the committed tree (``git clone``: tests that ask git about the tree find one; the working tree is
never touched), runs test-fast's selection there with ``-x`` and prints, per bug, whether a test failed and which one first. Exit status 1 when a
bug went unnoticed. Each bug is a one-line change of the formula an equation names; the list covers FedWaD,
OTDD, FedAvg, FedBary, KNOT's weights and Semantic Distance. Not part of the suite: a run takes minutes.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAST = ["-m", "not slow and not integration"]

#: (what, file, the line as committed, the line with the bug)
BUGS = [
    ("FedWaD eq. 10: t and 1 − t swapped", "otfed/ot/interpolation.py",
     "support = (1.0 - t) * mu.support + t * target", "support = t * mu.support + (1.0 - t) * target"),
    ("FedWaD eq. 5: atoms paired with the wrong target", "otfed/ot/interpolation.py",
     "support = (1.0 - t) * mu.support[rows] + t * nu.support[cols]",
     "support = (1.0 - t) * mu.support[rows] + t * nu.support[rows % nu.n]"),
    ("FedWaD Algorithm 1 line 10: estimate not the sum", "otfed/federation/fedwad.py",
     "        return d_mu.value + d_nu.value\n", "        return max(d_mu.value, d_nu.value) * 2\n"),
    ("OTDD: Bures term's cross term off", "otfed/ot/otdd.py",
     "bures[i] = tr_s[i] + tr_t - 2.0 * nuclear", "bures[i] = tr_s[i] + tr_t - 1.9 * nuclear"),
    ("FedAvg: uniform instead of size weights", "otfed/fl/fedavg.py",
     "    w = w / w.sum()\n", "    w = np.ones_like(w) / len(w)\n"),
    ("FedBary: calibrated gradient divides by m", "otfed/valuation/calibrated.py",
     "return f - (f.sum() - f) / (m - 1)", "return f - (f.sum() - f) / m"),
    ("KNOT weighting E: L1 instead of L2 confidence", "otfed/distill/weights.py",
     "return (q - bias).square().sum(-1).sqrt()", "return (q - bias).abs().sum(-1)"),
    ("KNOT weighting U: squared distance", "otfed/distill/weights.py",
     "return (q - 1.0 / q.shape[-1]).square().sum(-1).sqrt()", "return (q - 1.0 / q.shape[-1]).square().sum(-1)"),
    ("Semantic Distance: plain mean, not per label", "otfed/metrics.py",
     "return float(np.mean([errors[labels == label].mean() for label in np.unique(labels)]))",
     "return float(errors.mean())"),
]


def _fast_run(tree: Path) -> tuple[int, float, str]:
    """Test-fast's selection in ``tree``, stopping at the first failure: (exit status, seconds, first failure)."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", *FAST, "-x", "-q", "-p", "no:cacheprovider"], cwd=tree,
                          capture_output=True, text=True)
    first = next((line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))), "")
    if done.returncode not in (0, 1):  # pytest itself could not run: say why
        first = first or " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
    return done.returncode, time.monotonic() - start, first


def main() -> int:
    missed = 0
    with tempfile.TemporaryDirectory(prefix="otfed-planted-") as tmp:
        tree = Path(tmp) / "otfed"
        subprocess.run(["git", "clone", "-q", str(REPO), str(tree)], check=True)
        originals = {path: (tree / path).read_text() for _, path, _, _ in BUGS}
        status, seconds, first = _fast_run(tree)
        print(f"no bug: exit {status} in {seconds:.0f} s {first}", flush=True)
        if status != 0:
            return 2
        for what, path, line, bug in BUGS:
            if originals[path].count(line) != 1:
                print(f"STALE  {what}: {path} no longer holds its line once — update tests/planted_bugs.py")
                missed += 1
                continue
            (tree / path).write_text(originals[path].replace(line, bug))
            status, seconds, first = _fast_run(tree)
            (tree / path).write_text(originals[path])
            caught = status == 1
            missed += not caught
            print(f"{'caught' if caught else f'MISSED (exit {status})'}  {what} — {seconds:.0f} s; {first[:110]}",
                  flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
