"""Does ``make test-fast`` catch a bug in a core formula or a guard? ``python -m tests.planted_bugs`` plants one bug
at a time in a clone of the committed tree (``git clone``: tests that ask git about the tree find one; the working
tree is never touched), runs test-fast's selection there with ``-x`` and prints, per bug, whether a test failed and
which one first. Exit status 1 when a bug went unnoticed. Each bug is a one-line change: of the formula an equation
names (FedWaD, OTDD, FedAvg, FedBary, KNOT's weights, Semantic Distance), of a solver's promise (the semi-dual's
tolerance), of a threshold (the teacher gate, the FedWaD bracket's spread) or of a guard that keeps outputs and
servers safe (the caller check before the swap, the stage preflights). Not part of the suite: a run takes minutes.

``--worktree`` plants into a copy of the working tree as it is now (tracked and untracked files git does not
ignore) instead of the last commit: to check new tests before they are committed. Words after the options keep
only the bugs whose description contains one of them (``python -m tests.planted_bugs --worktree gate spread``).
"""
from __future__ import annotations

import shutil
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
    ("stage: no caller check right before the swap", "flows/stage.py",
     "lifeline.check()  # the last step before the swap", "pass  # the last step before the swap"),
    ("semi-dual: convergence check 1000x looser than tol", "otfed/ot/semidual.py",
     "    if err > tol:\n", "    if err > 1e3 * tol:\n"),
    ("fed_distance preflight: two usable clients not checked", "stages/fed_distance.py",
     "            roster_of(fed, compared[name])\n", "            pass\n"),
    ("partition preflight: raw .csv.gz never read whole (Path.suffix is '.gz')", "stages/partition.py",
     'if path.name.endswith(".csv.gz"):', 'if path.suffix == ".csv.gz":'),
    ("teacher gate: > instead of >= at the threshold", "otfed/distill/diagnostics.py",
     "info >= threshold", "info > threshold"),
    ("FedWaD bracket: spread without the halving", "otfed/federation/fedwad.py",
     "max(0.5 * (np.trace(m_mu.covariance) + np.trace(m_nu.covariance)), 0.0)",
     "max(np.trace(m_mu.covariance) + np.trace(m_nu.covariance), 0.0)"),
    ("FedWaD bracket: spread from mu's covariance twice", "otfed/federation/fedwad.py",
     "np.trace(m_mu.covariance) + np.trace(m_nu.covariance)", "np.trace(m_mu.covariance) + np.trace(m_mu.covariance)"),
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


def copy_worktree(tree: Path) -> None:
    """Make the clone ``tree`` hold the working tree's files as they are now: tracked and untracked files that git
    does not ignore are copied over, tracked files deleted in the working tree are deleted."""
    def listed(*flags: str) -> list[str]:
        out = subprocess.run(["git", "ls-files", "-z", *flags], cwd=REPO, capture_output=True, check=True).stdout
        return [name for name in out.decode().split("\0") if name]

    for name in listed("--deleted"):
        (tree / name).unlink(missing_ok=True)
    for name in listed("--cached", "--others", "--exclude-standard"):
        if (REPO / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, tree / name)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    worktree = "--worktree" in args
    words = [a for a in args if not a.startswith("--")]
    bugs = [bug for bug in BUGS if not words or any(w.lower() in bug[0].lower() for w in words)]
    missed = 0
    with tempfile.TemporaryDirectory(prefix="otfed-planted-") as tmp:
        tree = Path(tmp) / "otfed"
        subprocess.run(["git", "clone", "-q", str(REPO), str(tree)], check=True)
        if worktree:
            copy_worktree(tree)
        originals = {path: (tree / path).read_text() for _, path, _, _ in bugs}
        status, seconds, first = _fast_run(tree)
        print(f"no bug: exit {status} in {seconds:.0f} s {first}", flush=True)
        if status != 0:
            return 2
        for what, path, line, bug in bugs:
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
