# The two commands of the README:
#   make pipeline   — set up .venv (pinned, requirements.lock) and run the whole pipeline: dvc repro,
#                     then write the results page reports/index.html
#                     (make pipeline FORCE=1: dvc repro --force)
#   make test       — set up .venv and run the test suite (what .ci/run calls)
# and, while developing:
#   make test-fast  — the unit tests only (no test marked `slow` or `integration`): about 2 minutes of CPU
# and, for several stages / hosts logging at once (e.g. `dvc queue start -j 2`):
#   make mlflow-server   — an MLflow tracking server on 127.0.0.1:5000 (make mlflow-server MLFLOW_PORT=5001: another
#                          port): runs in mlflow-server/mlflow.db, artifacts in mlflow-server/artifacts, served
#                          through the server; it prints the `export MLFLOW_TRACKING_URI=...` line to use
VENV ?= .venv
export PATH := $(abspath $(VENV))/bin:$(PATH)
export PREFECT_HOME ?= $(abspath .prefect)
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false

.PHONY: setup flower-setup flower-check conformance pipeline test test-fast bench studies clean-runs mlflow-server gpu-check device-kit

$(VENV)/.installed: requirements.lock pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.lock
	$(VENV)/bin/pip install -q --no-deps -e .   # the otfed library, editable (its dependencies: the lock above)
	# the pipeline is not in the wheel: this checkout on the venv's path (stages/, flows/ for Dask and Prefect
	# workers started anywhere), and the `otfed` command of flows/cli.py
	$(VENV)/bin/python -c 'import pathlib, sys, sysconfig; pathlib.Path(sysconfig.get_path("purelib"), "otfed-checkout.pth").write_text(sys.argv[1] + "\n")' "$(CURDIR)"
	printf '#!/bin/sh\n# the otfed command of the checkout %s (make setup wrote it)\nexec "%s/bin/python" -m flows.cli "$$@"\n' "$(CURDIR)" "$(abspath $(VENV))" > $(VENV)/bin/otfed
	chmod +x $(VENV)/bin/otfed
	touch $@

setup: $(VENV)/.installed

# The Flower environment (otfed.flower: FedBary over a local SuperLink + SuperNodes): flwr 1.42.0 cannot share
# requirements.lock (requirements-flower.lock says why), so it gets a venv of its own holding flwr, otfed's core and
# otfed itself (editable); the pipeline's environment only starts its processes.
FLOWER_VENV ?= .venv-flower
$(FLOWER_VENV)/.installed: requirements-flower.lock pyproject.toml
	python3 -m venv $(FLOWER_VENV)
	$(FLOWER_VENV)/bin/pip install -q --upgrade pip
	$(FLOWER_VENV)/bin/pip install -q -r requirements-flower.lock
	$(FLOWER_VENV)/bin/pip install -q --no-deps -e .
	touch $@

flower-setup: $(FLOWER_VENV)/.installed

flower-check: setup flower-setup   ## FedBary over a local Flower federation vs in process, bit for bit (exit 0: equal)
	OTFED_FLOWER_VENV=$(abspath $(FLOWER_VENV)) python -m flows.flower_check

pipeline: setup   ## FORCE=1 recomputes every stage (and logs every stage to MLflow / Prefect again)
	python -m stages.params   # the whole params.yaml, every group: dvc repro skips stages that are not stale
	dvc repro $(if $(FORCE),--force)
	python -m flows.results   # reports/index.html: every paper table / figure next to otfed's

# pyDVL and OpenDataVal for the adapter tests (tests/federation/test_adapters.py): their declared pins conflict with
# the lock, so they go without dependencies into a folder of their own, which the tests append to the END of sys.path
# (the locked packages win); requirements-conformance.txt says what and why
CONFORMANCE := $(VENV)/conformance
$(CONFORMANCE)/.installed: requirements-conformance.txt $(VENV)/.installed
	rm -rf $(CONFORMANCE)
	$(VENV)/bin/pip install -q --no-deps --target $(CONFORMANCE) -r requirements-conformance.txt
	touch $@

conformance: $(CONFORMANCE)/.installed

PYTEST_WORKERS ?= 2   # make test: test files spread over this many processes (pytest-xdist; 0: one process)
# under make test the adapter tests fail, not skip, without the side install
test: export OTFED_CONFORMANCE := $(abspath $(CONFORMANCE))
test: export OTFED_REQUIRE_CONFORMANCE := 1
test: setup conformance
	python -m pytest -n $(PYTEST_WORKERS) --dist loadfile

# BLAS on one thread, as tests/conftest.py puts torch on one (idle BLAS threads spinning cost ~10 s of CPU here);
# `python -m tests.planted_bugs` checks that this selection catches a bug planted in each core formula and guard
test-fast: setup   ## no `slow` (stage runs, fresh interpreters, trainings, small-ε references, in-process Dask) or `integration` (real servers, subprocesses) test
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python -m pytest -m "not slow and not integration"

bench: setup   ## the benchmarks (time, memory, scaling) → reports/bench/ (tens of minutes; not part of the tests)
	python -m bench.fedwad_speed
	python -m bench.fedwad_accuracy
	python -m bench.fedwad_accuracy --seeds 10
	python -m bench.distill_speed
	python -m bench.distill_step
	python -m bench.fedbary_scaling
	python -m bench.scale_out   # task runners side by side (needs data/partitions: dvc repro partition)
	python -m bench.blas_threads   # fed_distance's jobs: task threads × BLAS threads (needs data/partitions)

# the research studies (questions about the methods, not timings) → reports/studies/; not part of the tests.
# studies.fedwad_support_rule is run by hand (its docstring has the command); knot_membership and knot_targets
# read the text track's committed outputs (models/text, data/text_*: dvc repro or dvc pull first)
studies: setup   ## the research studies → reports/studies/ (about an hour)
	python -m studies.removal_sweep   # where noise costs FedAvg accuracy and whether FedBary removal wins it back (~7 min)
	python -m studies.coreset_users   # FedWaD fig. 5 / 12 at 20, 50, 100 clients (~6 min)
	python -m studies.fedbary_features   # which features let FedBary see the noise (needs data/partitions, ~3 min)
	python -m studies.teacher_options   # stronger SA teachers within the offline rule (~30 min)
	python -m studies.privacy_attack_sweep   # a curious server's reconstructions over the privacy knobs (~30 s)
	python -m studies.knot_membership   # membership inference against the committed KNOT teachers
	python -m studies.knot_targets   # what the KNOT students are asked to learn

gpu-check: setup   ## on a CUDA machine: GPU info, the gpu-marked tests, a timed tiny text-track run → reports/gpu/gpu_check.txt
	bash gpu/gpu_check.sh

device-kit: setup   ## .devkit/: what a GPU node without a package index lacks (CPython 3.12), for gpu/gpu_session.sh
	python -m gpu.device_kit $(if $(WITH_DVC),--with-dvc)

clean-runs:  ## forget local MLflow / Prefect history (not the DVC outputs)
	rm -rf mlruns.db mlartifacts .prefect

MLFLOW_PORT ?= 5000
MLFLOW_WORKERS ?= 2
MLFLOW_SERVER_DIR := $(abspath mlflow-server)
mlflow-server: setup   ## MLflow tracking server: 127.0.0.1:$(MLFLOW_PORT), store and artifacts in mlflow-server/ (Ctrl-C stops it)
	mkdir -p $(MLFLOW_SERVER_DIR)/artifacts
	@echo "MLflow server on http://127.0.0.1:$(MLFLOW_PORT) (runs: $(MLFLOW_SERVER_DIR)/mlflow.db, artifacts: $(MLFLOW_SERVER_DIR)/artifacts)"
	@echo "log every stage to it — in each shell that runs dvc / python -m flows.stage <name>:"
	@echo "    export MLFLOW_TRACKING_URI=http://127.0.0.1:$(MLFLOW_PORT)"
	mlflow server --host 127.0.0.1 --port $(MLFLOW_PORT) --workers $(MLFLOW_WORKERS) \
		--backend-store-uri sqlite:///$(MLFLOW_SERVER_DIR)/mlflow.db \
		--serve-artifacts --artifacts-destination $(MLFLOW_SERVER_DIR)/artifacts
