#!/usr/bin/env bash
# prefect.yaml's GPU deployment end to end, in a copy of the checkout (gpu/gpu_session.sh worker-start runs it in
# the background): a Prefect server on 127.0.0.1, work pool otfed-gpu (process type), the deployment pipeline-gpu
# (flows/pipeline.py → dvc repro) run for OTFED_WORKER_STAGES (default: the text track) by one process worker
# pinned to GPU 0, then the flow run's final state. Exit 0 only when the flow run completed.
# Logs: server.log, worker.log beside job.log.
set -euo pipefail

PORT="${OTFED_WORKER_PORT:-4200}"
STAGES="${OTFED_WORKER_STAGES:-partition train_teachers estimate_bias distill}"
export OTFED_HOME="$PWD" PREFECT_API_URL="http://127.0.0.1:$PORT/api"
export PREFECT_HOME="$PWD/.prefect" PREFECT_UI_ENABLED=false PREFECT_SERVER_ANALYTICS_ENABLED=false

[ -d .git ] || dvc config --local core.no_scm true   # a copy without git history: DVC without SCM

echo "== server $(date -u +%H:%M:%S)"
prefect server start --host 127.0.0.1 --port "$PORT" > server.log 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
# wait for the server to answer: a ceiling of OTFED_SERVER_START_S seconds (default 600) only catches a hang
deadline=$((SECONDS + ${OTFED_SERVER_START_S:-600}))
until python3 -c "import urllib.request; urllib.request.urlopen('$PREFECT_API_URL/health', timeout=2)" 2>/dev/null; do
    kill -0 "$server" 2>/dev/null || { echo "the Prefect server exited:"; tail -20 server.log; exit 1; }
    [ "$SECONDS" -lt "$deadline" ] || { echo "the Prefect server did not answer at $PREFECT_API_URL within" \
        "${OTFED_SERVER_START_S:-600} s (OTFED_SERVER_START_S):"; tail -20 server.log; exit 1; }
    sleep 2
done

echo "== pool and deployment $(date -u +%H:%M:%S)"
prefect work-pool create otfed-gpu --type process
prefect --no-prompt deploy --name pipeline-gpu
stages_json=$(python3 -c "import json, sys; print(json.dumps(sys.argv[1:]))" $STAGES)
run_out=$(prefect deployment run otfed-pipeline/pipeline-gpu --param "stages=$stages_json")
echo "$run_out"
run_id=$(echo "$run_out" | grep -oE '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}' | head -1)

echo "== worker $(date -u +%H:%M:%S) (flow run $run_id, stages: $STAGES)"
CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" prefect worker start --pool otfed-gpu --name gpu-0 --limit 1 \
    --run-once > worker.log 2>&1 || { echo "the worker failed:"; tail -40 worker.log; exit 1; }

echo "== result $(date -u +%H:%M:%S)"
python3 - "$run_id" <<'EOF'
import sys
from prefect.client.orchestration import get_client

with get_client(sync_client=True) as client:
    run = client.read_flow_run(sys.argv[1])
print(f"flow run {run.name} ({run.id}): {run.state.type.value} — {run.state.message or ''}")
sys.exit(0 if run.state.is_completed() else 1)
EOF
