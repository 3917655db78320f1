#!/usr/bin/env bash
# GPU check (issue #12 "GPU workers, end to end"), for a CUDA machine:
#   1. the machine: nvidia-smi, and torch's view of CUDA (versions, devices, what run.device: auto resolves to);
#   2. the gpu-marked tests: python -m pytest -o addopts="" -q -m gpu tests/gpu
#      (FedAvg, the Sinkhorn loss, teacher / student steps and the stages on the GPU against CPU / POT values);
#   3. a timed text-track run (partition → train_teachers → estimate_bias → distill) on the stage tests' tiny
#      params with run.device: auto, in a temporary folder, then the same run with run.device: cpu for reference.
# Everything printed is also written to OUTPUT (default reports/gpu/gpu_check.txt).
#
# Usage: bash gpu/gpu_check.sh [OUTPUT]      (make gpu-check; PYTHON=... picks the interpreter, default python)
# Exit status: 0 when every step passed on a CUDA device; 1 when a step failed; 3 when torch sees no CUDA device
# (the gpu tests are then skipped and the timed run is a CPU run: the check has not been done).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
OUT="${1:-reports/gpu/gpu_check.txt}"
PYTHON="${PYTHON:-python}"
mkdir -p "$(dirname "$OUT")"

section() { printf '\n==== %s ====\n' "$*"; }

main() {
status=0

section "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) — otfed $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (uncommitted changes)')"

section "nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi || status=1
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv || true
else
    echo "nvidia-smi: not found"
fi

section "torch and CUDA"
"$PYTHON" - <<'EOF' || status=1
import torch

from otfed.device import resolve_device

print(f"torch {torch.__version__}, built for CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
print(f"torch.cuda.is_available(): {torch.cuda.is_available()}; devices: {torch.cuda.device_count()}")
for i in range(torch.cuda.device_count()):
    props = torch.cuda.get_device_properties(i)
    print(f"  cuda:{i} {props.name}, compute capability {props.major}.{props.minor}, "
          f"{props.total_memory / 2**30:.1f} GiB, {props.multi_processor_count} SMs")
print(f"TF32 matmul allowed: {torch.backends.cuda.matmul.allow_tf32}; float32 matmul precision: "
      f"{torch.get_float32_matmul_precision()}")
print(f"run.device: auto resolves to {resolve_device('auto')!r}")
EOF
has_cuda=$("$PYTHON" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
if [ "$has_cuda" != "1" ]; then
    echo "WARNING: torch sees no CUDA device — the gpu tests will be skipped and the timed run is a CPU run"
fi

section "gpu-marked tests: $PYTHON -m pytest -o addopts=\"\" -q -m gpu tests/gpu"
start=$(date +%s)
TQDM_DISABLE=1 "$PYTHON" -m pytest -o addopts="" -q -m gpu -rs tests/gpu || status=1
echo "(tests took $(( $(date +%s) - start )) s)"

section "timed tiny text-track run: run.device auto, then cpu"
TQDM_DISABLE=1 "$PYTHON" - <<'EOF' || status=1
import importlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())
import mlflow
import torch

from flows.stage import run_stage
from otfed.device import resolve_device
from stages.params import validate_params
from tests.stages.test_text_stages import text_params

STAGES = ("partition", "train_teachers", "estimate_bias", "distill")
# one-off costs kept out of the stage timings: imports, the MLflow schema (migrated once, copied per run), CUDA init
for name in ("stages.partition", "stages.train_teachers", "stages.estimate_bias", "stages.distill",
             "transformers.models.bert.modeling_bert", "transformers.models.distilbert.modeling_distilbert"):
    importlib.import_module(name)
template = Path(tempfile.mkdtemp(prefix="otfed_gpu_check_mlflow_")) / "mlruns.db"
mlflow.MlflowClient(tracking_uri=f"sqlite:///{template}").search_experiments()
if torch.cuda.is_available():
    start = time.perf_counter()
    torch.zeros(1, device="cuda").sum().item()
    print(f"CUDA context start-up: {time.perf_counter() - start:.2f} s")
repo, timings = os.getcwd(), {}
warm = Path(tempfile.mkdtemp(prefix="otfed_gpu_check_warmup_"))  # an untimed partition run: first-call costs
shutil.copy(template, warm / "mlruns.db")
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{warm / 'mlruns.db'}"
os.chdir(warm)
run_stage("partition", validate_params(text_params(warm), stage="partition"))
os.chdir(repo)
shutil.rmtree(warm, ignore_errors=True)
for device in ("auto", "cpu"):
    root = Path(tempfile.mkdtemp(prefix=f"otfed_gpu_check_{device}_"))
    shutil.copy(template, root / "mlruns.db")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / 'mlruns.db'}"
    os.chdir(root)
    try:
        params = text_params(root)
        params["run"]["device"] = device
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        seconds = {}
        for stage in STAGES:
            start = time.perf_counter()
            run_stage(stage, validate_params(params, stage=stage))
            seconds[stage] = time.perf_counter() - start
        tables = sorted(str(p.relative_to(root)) for p in root.glob("reports/**/*.csv"))
        peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else 0.0
        timings[device] = (resolve_device(device), seconds, len(tables), peak)
    finally:
        os.chdir(repo)
        shutil.rmtree(root, ignore_errors=True)

print("\nrun.device  resolved  " + "  ".join(f"{s:>14}" for s in STAGES) + "     total  tables  peak GPU MiB")
for device, (resolved, seconds, n_tables, peak) in timings.items():
    print(f"{device:<10}  {resolved:<8}  " + "  ".join(f"{seconds[s]:>12.2f} s" for s in STAGES)
          + f"  {sum(seconds.values()):>6.2f} s  {n_tables:>6}  {peak:>12.1f}")
print("(tiny params — a few dozen texts, a one-layer model: this times the code path, start-up and transfers, "
      "not the GPU's throughput)")
shutil.rmtree(template.parent, ignore_errors=True)
EOF

section "result"
if [ "$status" -ne 0 ]; then
    echo "FAILED: a step above failed (exit 1)"
elif [ "$has_cuda" != "1" ]; then
    echo "NOT CHECKED: no CUDA device (exit 3)"
    status=3
else
    echo "OK: the gpu tests passed and the text track ran on $("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(0))')"
fi
return "$status"
}

# live output on the terminal; in OUTPUT, each progress bar line reduced to what the terminal shows last (the text
# after its last carriage return)
main 2>&1 | tee "$OUT.raw"
status=${PIPESTATUS[0]}
sed -e 's/.*\r//' "$OUT.raw" > "$OUT" && rm -f "$OUT.raw"
echo "written: $OUT"
exit "$status"
