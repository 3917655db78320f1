"""``otfed`` — the one command (``[project.scripts]`` in pyproject.toml; also ``python -m flows.cli``).

::

    otfed run STAGE [--params FILE] [--verbose]   one stage through the generic Prefect flow (flows/stage.py)
    otfed repro [STAGE ...] [DVC OPTIONS]         dvc repro: DVC decides what is stale and runs it
    otfed results [--out FILE] [--reports DIR]    the results page of the last run (flows/results.py)
    otfed doctor [--params FILE] [--fix]          check the environment, one line per check (flows/doctor.py);
                                                  --fix cleans what killed stages left
    otfed flower check [--seed N] [--insecure]    FedBary over a local Flower federation (TLS) vs in process, bit
                                                  for bit (flows.flower_check; needs .venv-flower: make flower-setup)

Thin: each command hands over to the module that does the work, imported inside the command so that
``otfed --help`` answers at once. Exit status: the command's own (2 for bad params or an unknown stage).
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import List, Optional

import typer

PARAMS_HELP = "The params file (default: params.yaml in the current folder)."
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}

app = typer.Typer(name="otfed", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="otfed: optimal transport for federated learning, as a DVC + Prefect + MLflow pipeline. "
                       "Run from the repository root.")


@app.command()
def run(stage: str = typer.Argument(..., help="The stage to run (partition, fed_distance, distill, …)."),
        params: Path = typer.Option(Path("params.yaml"), "--params", "-p", help=PARAMS_HELP),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Prefect's logs and full tracebacks on the "
                                                                     "console.")) -> None:
    """Run one stage (what `dvc repro` calls for it): params checked, outputs swapped in on success; an
    unknown stage exits 2 listing the stages."""
    from flows.stage import main as run_stage_main

    raise typer.Exit(run_stage_main(stage, params_path=params, argv=["--verbose"] if verbose else []))


@app.command(context_settings=PASS_THROUGH)
def repro(args: Optional[List[str]] = typer.Argument(None, help="Stages, and any `dvc repro` option "
                                                                 "(--force, --dry, -s …).")) -> None:
    """Reproduce the pipeline: the whole params.yaml validated, what killed stages left beside the outputs cleaned
    (even when no stage is stale), then `dvc repro [STAGES...]` (only what is stale runs — a misspelt key in a
    group no stale stage reads would otherwise pass unnoticed)."""
    from flows import leftovers
    from flows.doctor import tool_path
    from stages.params import main as validate_params_file, stages

    if validate_params_file(["params.yaml"]) != 0:
        raise typer.Exit(2)
    for found in leftovers.clean_stale(folder for stage in stages().values() for folder in stage.outputs):
        if not found.quiet:
            typer.echo(found.line(), err=True)

    dvc = tool_path("dvc")
    if dvc is None:
        typer.echo("error: dvc not found on the PATH (activate the environment: source .venv/bin/activate)",
                   err=True)
        raise typer.Exit(2)
    raise typer.Exit(subprocess.call([dvc, "repro", *(args or [])]))


@app.command(context_settings=PASS_THROUGH)
def results(args: Optional[List[str]] = typer.Argument(None, help="Passed on to `python -m flows.results` "
                                                                  "(--reports DIR, --out FILE).")) -> None:
    """The results of the last run in one page (`python -m flows.results`: reports/index.html)."""
    from flows import results as summary

    raise typer.Exit(summary.main(list(args or [])) or 0)


@app.command()
def doctor(params: Path = typer.Option(Path("params.yaml"), "--params", "-p", help=PARAMS_HELP),
           fix: bool = typer.Option(False, "--fix", help="Clean what killed stages left: staging folders, "
                                                         "MLflow runs left RUNNING.")) -> None:
    """Check the environment: Python, pinned packages, dvc and git, params, embedded data, CUDA, MLflow store,
    leftovers of killed stages. One line per check (ok / FAIL / info); exit status 1 if any check FAILs."""
    from flows import doctor as checks

    raise typer.Exit(checks.run(params, echo=typer.echo, fix=fix))


flower = typer.Typer(name="flower", no_args_is_help=True,
                     help="otfed's protocols as Flower apps over a local federation (make flower-setup first).")
app.add_typer(flower)


@flower.command("check")
def flower_check(seed: int = typer.Option(0, help="The session's seed."),
                 timeout: float = typer.Option(600.0, help="Bound on every wait, seconds."),
                 insecure: bool = typer.Option(False, help="Plain HTTP instead of TLS with a CA made for the run.")
                 ) -> None:
    """One FedBary session over a local SuperLink and three SuperNodes (TLS) and in process: one line per protocol,
    exit 0 when every number is equal bit for bit, 1 when one differs, 2 when the federation could not run."""
    from flows.flower_check import main as check_main

    raise typer.Exit(check_main(["--seed", str(seed), "--timeout", str(timeout), *(["--insecure"] if insecure else [])]))


def main() -> None:
    """The ``otfed`` entry point: parse ``sys.argv``, run the command, exit with its status."""
    app(prog_name="otfed")


if __name__ == "__main__":  # python -m flows.cli
    main()
