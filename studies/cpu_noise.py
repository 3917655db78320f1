"""Which KNOT verdicts are within CPU noise? The text track recomputed on other float kernels, claim by claim.

The committed teachers were trained on one machine's kernels; another x86-64 CPU computes a training step's
floats in a different order (``python -m tests.kernel_fingerprint`` shows which op), and training amplifies the
last bit. So a fresh clone does not retrain (the trained text track ships with the repository), and this study
measures what a recomputation elsewhere would change. For each kernel variant below it clones the committed tree
into a scratch folder, retrains the teachers (``dvc repro --force -s train_teachers``) and redoes what follows
(``dvc repro distill``) under that variant's environment, keeps its ``claims.csv``, and compares every claim's
verdict with the committed one. A verdict that flips under any variant is *within CPU noise*: its confidence
interval sits at zero's edge, and a machine's kernels decide it.

Variants, each a set of float kernels this machine can run that the committed run did not (the committed one:
otfed's portable kernels — ATen AVX2, MKL's compatible branch, oneDNN off, OpenBLAS Haswell):

* ``native`` — every library's own choice (``OTFED_CPU_KERNELS=native``): on an AVX-512 Xeon, ATen's AVX-512
  kernels, MKL's AVX-512 branch, oneDNN on, OpenBLAS SkylakeX;
* ``generic`` — ATen's baseline (non-vectorised) kernels and MKL's SSE4.2 branch (``ATEN_CPU_CAPABILITY=default
  MKL_CBWR=SSE4_2``), OpenBLAS Haswell.

    python -m studies.cpu_noise                      # both variants: about 35 min each on 2 cores
    python -m studies.cpu_noise --variant native
    python -m studies.cpu_noise --reuse native=/tmp/run   # compare a finished recomputation (a clone) instead

Results: reports/studies/cpu_noise/<variant>_{claims,gate}.csv (each recomputation's claims and teachers) and
reports/studies/cpu_noise.{csv,md} (every claim: committed verdict, each variant's, within CPU noise or not).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from otfed import io

REPO = Path(__file__).resolve().parent.parent
CLAIMS = Path("reports/distill/claims.csv")
GATE = Path("reports/distill/gate.csv")  # each teacher's audit-slice Semantic Distance: how far training moved it
OUT = Path("reports/studies")
KEY = ["task", "arm", "test_set", "claim", "metric"]

#: variant → the environment its recomputation runs in (on top of the caller's)
VARIANTS: dict[str, dict[str, str]] = {
    "native": {"OTFED_CPU_KERNELS": "native"},
    "generic": {"OTFED_CPU_KERNELS": "native", "ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "SSE4_2",
                "OPENBLAS_CORETYPE": "Haswell"},
}

#: what the recomputation runs, in a clone of the committed tree
COMMANDS = (("dvc", "repro", "partition"), ("dvc", "repro", "--force", "-s", "train_teachers"),
            ("dvc", "repro", "distill"))


def recompute(variant: str, workdir: Path) -> Path:
    """Clone the committed tree into ``workdir``, run :data:`COMMANDS` there under ``variant``'s environment, and
    return the clone (its ``reports/distill/claims.csv`` is the recomputed one)."""
    subprocess.run(["git", "clone", "-q", str(REPO), str(workdir)], check=True)
    venv = REPO / ".venv"
    if venv.exists():
        (workdir / ".venv").symlink_to(venv)
    env = {**os.environ, **VARIANTS[variant], "PREFECT_HOME": str(workdir / ".prefect"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for command in COMMANDS:
        print(f"[{variant}] {' '.join(command)}", flush=True)
        subprocess.run(command, cwd=workdir, env=env, check=True)
    return workdir


def verdicts(committed: pd.DataFrame, recomputed: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per claim: the committed verdict and difference, each variant's, and ``within_cpu_noise`` (some
    variant's verdict differs from the committed one)."""
    table = committed[KEY + ["mean_difference", "ci95", "verdict"]].rename(columns={"mean_difference": "difference"})
    for name, frame in recomputed.items():
        part = frame[KEY + ["mean_difference", "verdict"]].rename(
            columns={"mean_difference": f"difference_{name}", "verdict": f"verdict_{name}"})
        table = table.merge(part, on=KEY, how="left", validate="one_to_one")
        if table[f"verdict_{name}"].isna().any():
            raise ValueError(f"{name}: the recomputed claims.csv lacks claims the committed one has")
    table["within_cpu_noise"] = (table[[f"verdict_{n}" for n in recomputed]].ne(table["verdict"], axis=0)).any(axis=1)
    return table


def teacher_shift(committed: pd.DataFrame, recomputed: pd.DataFrame) -> float:
    """The largest relative change of a teacher's audit-slice Semantic Distance (``gate.csv``) between two runs."""
    both = committed.merge(recomputed, on=["task", "teacher"], suffixes=("", "_other"), validate="one_to_one")
    return float(((both.semantic_distance_other - both.semantic_distance).abs() / both.semantic_distance).max())


def summary(table: pd.DataFrame, variants: list[str], shifts: dict[str, float]) -> str:
    """The Markdown page: how far the teachers and the claims' differences moved, verdict flips per metric and the
    claims within CPU noise."""
    lines = ["# KNOT verdicts within CPU noise (`python -m studies.cpu_noise`)", "",
             "The text track recomputed under other float kernels (teachers retrained, bias, students): a verdict "
             "that flips under any variant is within CPU noise.", "",
             "| variant | teachers' audit SD, largest relative change | claims' difference, median / largest change "
             "(macro-F1 or accuracy) | (SD) |", "| --- | --- | --- | --- |"]
    for n in variants:
        moved = (table[f"difference_{n}"] - table.difference).abs().groupby(table.metric)
        lines.append(f"| {n} | {shifts[n]:.1e} | {moved.median()['score']:.4f} / {moved.max()['score']:.4f} | "
                     f"{moved.median()['semantic_distance']:.4f} / {moved.max()['semantic_distance']:.4f} |")
    lines += ["", "| metric | claims | flipped under " + " | flipped under ".join(variants) + " | within CPU noise |",
              "| --- | --- | " + "--- | " * len(variants) + "--- |"]
    for metric, part in table.groupby("metric"):
        flips = [int((part[f"verdict_{n}"] != part["verdict"]).sum()) for n in variants]
        lines.append(f"| {metric} | {len(part)} | " + " | ".join(map(str, flips))
                     + f" | {int(part.within_cpu_noise.sum())} |")
    noisy = table[table.within_cpu_noise]
    lines += ["", f"Within CPU noise: {len(noisy)} of {len(table)} claims "
              f"({int(noisy.test_set.eq('ALL').sum())} of {int(table.test_set.eq('ALL').sum())} on the ALL test set).",
              "", "| task | arm | test set | claim | metric | committed | " + " | ".join(variants) + " |",
              "| --- | --- | --- | --- | --- | --- |" + " --- |" * len(variants)]
    for _, r in noisy.iterrows():
        cells = [f"{r[f'verdict_{n}']} ({r[f'difference_{n}']:+.4f})" for n in variants]
        lines.append(f"| {r.task} | {r.arm} | {r.test_set} | {r.claim} | {r.metric} | "
                     f"{r.verdict} ({r.difference:+.4f}) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS),
                        help="a kernel variant to recompute under (default: all)")
    parser.add_argument("--reuse", action="append", default=[], metavar="VARIANT=DIR",
                        help="a finished recomputation of VARIANT: a clone that ran the study's commands")
    args = parser.parse_args(argv)
    reused = dict(item.split("=", 1) for item in args.reuse)
    unknown = sorted(set(reused) - set(VARIANTS))
    if unknown:
        parser.error(f"--reuse: unknown variant(s) {unknown}; known: {sorted(VARIANTS)}")
    variants = sorted(set(args.variant or VARIANTS) | set(reused), key=list(VARIANTS).index)
    (OUT / "cpu_noise").mkdir(parents=True, exist_ok=True)
    recomputed, gates = {}, {}
    for name in variants:
        scratch = None if name in reused else Path(tempfile.mkdtemp(prefix=f"otfed-cpu-noise-{name}-"))
        try:
            clone = Path(reused[name]) if scratch is None else recompute(name, scratch / "clone")
            recomputed[name], gates[name] = pd.read_csv(clone / CLAIMS), pd.read_csv(clone / GATE)
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        io.write_csv(recomputed[name], OUT / "cpu_noise" / f"{name}_claims.csv")
        io.write_csv(gates[name], OUT / "cpu_noise" / f"{name}_gate.csv")
    table = verdicts(pd.read_csv(REPO / CLAIMS), recomputed)
    shifts = {name: teacher_shift(pd.read_csv(REPO / GATE), gate) for name, gate in gates.items()}
    page = summary(table, variants, shifts)
    io.write_csv(table, OUT / "cpu_noise.csv")
    io.write_text(page, OUT / "cpu_noise.md")
    print(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
