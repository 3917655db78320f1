#!/usr/bin/env bash
# The project's GPU runs, phase by phase, on a CUDA node without a package index: a CUDA check of the tests and of
# the Sinkhorn backends, the scale-out benchmarks on all the node's cores, the paper-scale text track and a Prefect
# GPU worker. Each phase writes its reports under reports/ and bundles them, with its log, as $OUT/<phase>.tar.gz;
# the two long runs start in the background in a copy of the checkout and are followed with `wait` and `collect`,
# so no phase blocks for more than about ten minutes.
#
#   check        (~8 min)  the kit; gpu/gpu_check.sh (nvidia-smi, the gpu-marked tests, a timed tiny text-track
#                          run on CUDA and on the CPU); bench.distill_step --device cuda with the adaptive
#                          ("newton") and the fixed-shape ("fixed") Sinkhorn solver at batch 32 and 256;
#                          bench.sinkhorn_backends --device cuda (fixed / newton / geomloss / POT)
#   scale        (~6 min)  bench.scale_out (190 FedWaD pairs) and bench.fedbary_scale_out (FedBary, 100 clients)
#                          on all the node's cores: sequential, thread and dask side by side
#   paper-start [SOLVER]   the text track with params-paper.yaml (100,000-text bias, the papers' ε and epochs,
#                          every variant × seed), started in the background on the GPU (seconds); SOLVER sets
#                          distill.sinkhorn_solver (newton, the default, or fixed: pick what `check` found faster)
#   worker-start (seconds) prefect.yaml's GPU deployment end to end: a Prefect server, work pool otfed-gpu, the
#                          deployment pipeline-gpu (flows/pipeline.py: dvc repro) run for the text track's stages
#                          (OTFED_WORKER_STAGES) by a process worker, in the background; needs DVC's archive
#                          (.devkit/dvc.tar.xz) beside the kit an earlier phase unpacked
#   wait JOB [S]           waits up to S seconds (default 560) for job paper or worker, printing where it is;
#                          exit 0 when it finished, 75 while it still runs, 1 when it failed
#   collect JOB            the job's reports (text track) and logs → $OUT/JOB.tar.gz
#
# Packages: the node's own torch / numpy stack, plus the kit built where pip works (python -m gpu.device_kit, or
# make device-kit): OTFED_KIT (default .devkit/site.tar.xz) is unpacked once into OTFED_SITE and put first on
# PYTHONPATH; worker-start also unpacks DVC's archive (.devkit/dvc.tar.xz, built with --with-dvc) over it.
# OTFED_KIT=none uses the packages already installed (a machine with the lock installed; the tests).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
PHASE="${1:-}"
OUT="${OUT:-/tmp/otfed-gpu-out}"
KIT="${OTFED_KIT:-.devkit/site.tar.xz}"     # python -m gpu.device_kit
DVC_KIT="${OTFED_DVC_KIT:-.devkit/dvc.tar.xz}"  # python -m gpu.device_kit --with-dvc
SITE="${OTFED_SITE:-/tmp/otfed-site}"       # where it is unpacked
JOBS="${OTFED_JOBS:-/tmp/otfed-jobs}"       # background jobs: a copy of the checkout each, JOBS/<job>
mkdir -p "$OUT"

unpack_kit() {  # the kit first on the paths (OTFED_KIT=none: the environment has the packages already), and
               # the settings every phase runs with
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    if [ "$KIT" != none ]; then
        if [ ! -f "$SITE/.unpacked" ]; then
            if [ ! -f "$KIT" ]; then
                echo "no $KIT: build it with 'python -m gpu.device_kit' where pip works, and carry it" >&2
                exit 2
            fi
            mkdir -p "$SITE" && tar -xJf "$KIT" -C "$SITE" && touch "$SITE/.unpacked" || exit 2
        fi
        export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
        export PATH="$SITE/bin:$PATH"
    fi
    export PREFECT_HOME=/tmp/otfed-prefect PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_UI_ENABLED=false
    export TQDM_MININTERVAL=30
    export PYTHONUNBUFFERED=1
}

bundle() {  # bundle NAME FILES...: $OUT/NAME.tar.gz of the files that exist
    local name=$1; shift
    local have=()
    for f in "$@"; do [ -e "$f" ] && have+=("$f"); done
    [ ${#have[@]} -gt 0 ] && tar -czf "$OUT/$name.tar.gz" "${have[@]}" && echo "written: $OUT/$name.tar.gz (${have[*]})"
}

case "$PHASE" in
check)
    unpack_kit
    status=0
    { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
      python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'
    } 2>&1 | tee "$OUT/check.log"
    # the bundle is rewritten after every step: a call cut off at its time limit still brings back what ran
    PYTHON=python3 bash gpu/gpu_check.sh reports/gpu/gpu_check.txt 2>&1 | tail -40 | tee -a "$OUT/check.log" || status=1
    bundle check reports/gpu/gpu_check.txt
    for solver in newton fixed; do
        python3 -m bench.distill_step --device cuda --solver "$solver" --batch 32 256 \
            --out "reports/bench/cuda/$solver" 2>&1 | tail -12 | tee -a "$OUT/check.log" || status=1
        bundle check reports/gpu/gpu_check.txt reports/bench/cuda
    done
    python3 -m bench.sinkhorn_backends --device cuda --out reports/bench/cuda 2>&1 | tail -8 \
        | tee -a "$OUT/check.log" || status=1
    bundle check reports/gpu/gpu_check.txt reports/bench/cuda
    exit $status
    ;;
scale)
    unpack_kit
    status=0
    python3 -m flows.stage partition > "$OUT/scale.log" 2>&1 || status=1
    workers=$(nproc)
    python3 -m bench.scale_out --workers "$workers" --name "scale_out_$workers" 2>&1 | tail -15 \
        | tee -a "$OUT/scale.log" || status=1
    bundle scale "reports/bench/scale_out_$workers.md" "reports/bench/scale_out_$workers.csv"
    python3 -m bench.fedbary_scale_out --workers "$workers" --name "fedbary_scale_out_$workers" 2>&1 | tail -12 \
        | tee -a "$OUT/scale.log" || status=1
    bundle scale "reports/bench/scale_out_$workers.md" "reports/bench/scale_out_$workers.csv" \
        "reports/bench/fedbary_scale_out_$workers.md" "reports/bench/fedbary_scale_out_$workers.csv"
    exit $status
    ;;
paper-start|worker-start)
    job=${PHASE%-start}
    unpack_kit
    if [ "$job" = worker ] && [ "$KIT" != none ] && [ ! -f "$SITE/.dvc-unpacked" ]; then
        if [ ! -f "$SITE/.unpacked" ] || [ ! -f "$DVC_KIT" ]; then
            echo "worker-start needs $DVC_KIT carried in this call and the kit unpacked by an earlier one" >&2
            exit 2
        fi
        tar -xJf "$DVC_KIT" -C "$SITE" && touch "$SITE/.dvc-unpacked" || exit 2
    fi
    work="$JOBS/$job"
    rm -rf "$work" && mkdir -p "$work" || exit 1
    tar --exclude=./.venv --exclude=./.devkit --exclude=./.git --exclude=./.dvc/cache --exclude=./.dvc/tmp \
        --exclude=./mlruns.db --exclude=./.prefect -cf - . | tar -C "$work" -xf - || exit 1
    cd "$work" || exit 1
    if [ "$job" = paper ]; then
        cp params-paper.yaml params.yaml || exit 1
        if [ -n "${2:-}" ]; then   # paper-start SOLVER: distill.sinkhorn_solver (newton | fixed)
            python3 - "$2" <<'PY' || exit 2
import sys, yaml
params = yaml.safe_load(open("params.yaml"))
params["distill"]["sinkhorn_solver"] = sys.argv[1]
from stages.params import validate_params
try:  # a bad solver: one line naming the key, before anything runs
    validate_params(params, stage="distill")
except Exception as exc:
    sys.exit(f"error: {exc}")
yaml.safe_dump(params, open("params.yaml", "w"), sort_keys=False)
PY
        fi
        run='for s in partition train_teachers estimate_bias distill; do
    echo "== $s $(date -u +%H:%M:%S)"; python3 -m flows.stage $s || exit 1
done'
    else
        run='bash gpu/gpu_worker_job.sh'
    fi
    cat > job.sh <<EOF
start=\$(date +%s)
if ( $run ); then echo "DONE in \$(( \$(date +%s) - start )) s"; else echo FAILED; exit 1; fi
EOF
    setsid bash job.sh > job.log 2>&1 < /dev/null &
    echo $! > job.pid   # its process group: kill -- -$(cat job.pid) stops it
    echo "started job $job in $work (log: $work/job.log)"
    ;;
wait)
    job="${2:-}"; limit="${3:-560}"
    log="$JOBS/$job/job.log"
    [ -f "$log" ] || { echo "no job ${job:-?} (paper-start / worker-start first, on this machine)" >&2; exit 2; }
    start=$(date +%s)
    while [ $(( $(date +%s) - start )) -lt "$limit" ]; do
        if grep -q "^DONE" "$log"; then tail -5 "$log"; exit 0; fi
        if grep -q "^FAILED" "$log"; then tail -40 "$log"; exit 1; fi
        sleep 10
    done
    grep "^== " "$log" | tail -1; tail -3 "$log"
    exit 75
    ;;
collect)
    job="${2:-}"
    cd "$JOBS/$job" 2>/dev/null || { echo "no job ${job:-?} on this machine" >&2; exit 2; }
    cp job.log "$OUT/$job.log"
    bundle "$job" reports/teachers reports/bias reports/distill job.log server.log worker.log
    ;;
*)
    echo "usage: bash gpu/gpu_session.sh check | scale | paper-start | worker-start | wait JOB [SECONDS] | collect JOB" >&2
    exit 2
    ;;
esac
