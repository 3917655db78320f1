# The two commands of the README:
#   make pipeline   — set up .venv (pinned, requirements.lock) and run the whole pipeline: dvc repro,
#                     then write the results page reports/index.html
#                     (make pipeline FORCE=1: dvc repro --force)
#   make test       — set up .venv and run the test suite (what .ci/run calls)
VENV ?= .venv
export PATH := $(abspath $(VENV))/bin:$(PATH)
export PREFECT_HOME ?= $(abspath .prefect)
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false

.PHONY: setup pipeline test bench clean-runs

$(VENV)/.installed: requirements.lock
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.lock
	$(VENV)/bin/pip install -q --no-deps -e .   # the `otfed` command (its dependencies: the lock above)
	touch $@

setup: $(VENV)/.installed

pipeline: setup   ## FORCE=1 recomputes every stage (and logs every stage to MLflow / Prefect again)
	dvc repro $(if $(FORCE),--force)
	python -m flows.results   # reports/index.html: every paper table / figure next to otfed's

test: setup
	python -m pytest

bench: setup   ## every benchmark → reports/bench/ (tens of minutes; not part of the tests)
	python -m bench.fedwad_speed
	python -m bench.distill_speed
	python -m bench.distill_step
	python -m bench.fedbary_scaling

clean-runs:  ## forget local MLflow / Prefect history (not the DVC outputs)
	rm -rf mlruns.db mlartifacts .prefect
