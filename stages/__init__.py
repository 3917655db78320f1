"""One module per DVC stage, every one the same shape (see stages/stage.py); stages/params.py finds them.

A stage module is no command: every stage runs through the one entry point, the runner ``python -m flows.stage
<name>`` (what ``dvc.yaml`` runs; ``otfed run <name>``). ``python -m stages.<name>`` stops here with an error
saying so, instead of importing the module and exiting 0 having run nothing."""
import sys

from otfed.cpu_kernels import use_portable_kernels

COMMANDS = ("stages.params",)  # the modules of this package that are commands (python -m stages.params FILE)


def _refuse_stage_as_command() -> None:
    argv = getattr(sys, "orig_argv", [])
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    if module.startswith("stages.") and module not in COMMANDS:
        name = module.split(".")[1]
        print(f"error: `python -m {module}` runs nothing: a stage runs through the runner, "
              f"`python -m flows.stage {name}` (what dvc.yaml runs; or `otfed run {name}`)", file=sys.stderr)
        sys.exit(2)


_refuse_stage_as_command()
use_portable_kernels()  # whoever imports a stage module first (the runner `python -m flows.stage <name>` does it in
# flows/__init__.py already; a notebook, a test, a Dask worker): before any stage module imports numpy or torch
