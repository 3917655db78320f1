"""``params.yaml``: the run group, every stage's group (found in the stage modules), validated once.

:func:`load_params` reads the file and validates it into :class:`Params` — a model with the ``run``
group and one field per stage, typed with the stage module's own params type. pydantic's errors become
one line per problem naming the key path and what is allowed (:class:`~otfed.errors.ConfigError`); the
runner prints them and exits with status 2 without writing anything.

``load_params(path, stage=name)`` validates only what that stage needs (:func:`groups_of`: ``run``,
``partition``, its own group and the groups it reads or checks): the text track runs with no valid — or no
— feature-track groups, and the other way round. Without a stage, the whole file is validated.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
import sys
import typing
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, create_model, field_validator, model_validator

from otfed.errors import ConfigError
from otfed.schema import Strict, plain_message
from stages.stage import Stage

INFRASTRUCTURE = {"stage", "params", "layout"}  # modules of stages/ that are not stages

# the ``run`` keys a stage's results depend on (its dvc.yaml params deps): task_runner, max_workers and
# dask_address choose where tasks run, not what they compute (tests/integration/test_dask_runner.py checks
# byte-identical outputs on every runner), so changing them does not make a stage stale
RUN_RESULT_KEYS = ("run.seed", "run.device")

# a Dask scheduler address: tcp://host:port (also tls://, ucx://, or host:port, which Dask reads as tcp://)
DASK_ADDRESS = re.compile(r"^(?:(?:tcp|tls|ucx)://)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}$")


# the largest run.seed: scikit-learn's random_state (the PCA of partition, spectral clustering, logistic regression)
# takes 0 … 2**32 − 1 and torch's manual_seed 0 … 2**64 − 1 (numpy's SeedSequence any size); the stages pass
# run.seed + k on, k below a few hundred (the seeds counts ≤ 100, a task's party index, +1 / +2 for a second
# generator), so 2**31 − 1 keeps every seed they derive within both (2**70 overflowed inside a task before)
SEED_MAX = 2**31 - 1


class RunParams(Strict):
    """Settings shared by every stage."""

    seed: int = Field(0, ge=0, le=SEED_MAX, description="Global seed; the same params give the same numbers twice.")
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N — where torch code runs.")
    task_runner: Literal["thread", "sequential", "dask"] = Field(
        "thread", description="How a stage's tasks run: threads of its process, one after another, or on a Dask "
                              "cluster (flows/runners.py).")
    max_workers: int = Field(2, ge=1, le=256, description="Threads (thread) or local Dask worker processes (dask).")
    dask_address: str | None = Field(
        None, description="dask only: a running scheduler (tcp://host:8786); null starts a local cluster of "
                          "max_workers processes for each stage.")

    @field_validator("dask_address")
    @classmethod
    def _dask_address(cls, v: str | None) -> str | None:
        if v is None or DASK_ADDRESS.match(v):
            return v
        raise ValueError(f"must be a Dask scheduler address such as tcp://127.0.0.1:8786, or null (got {v!r})")

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v in {"auto", "cpu", "cuda"} or (v.startswith("cuda:") and v[5:].isdigit()):
            return v
        raise ValueError(f"must be one of auto, cpu, cuda, cuda:N (got {v!r})")


@cache
def stages() -> dict[str, Stage]:
    """Every stage of the pipeline: the ``STAGE`` of each module in ``stages/``, by name."""
    import stages as package

    found: dict[str, Stage] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name in INFRASTRUCTURE or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"stages.{info.name}")
        stage = getattr(module, "STAGE", None)
        if isinstance(stage, Stage):
            found[stage.name] = stage
    return found


def stage(name: str) -> Stage:
    """The stage called ``name``; ConfigError listing the stages otherwise."""
    known = stages()
    if name not in known:
        raise ConfigError(f"unknown stage {name!r}; stages: {', '.join(sorted(known))}")
    return known[name]


def groups_of(s: Stage | str) -> tuple[str, ...]:
    """The params groups stage ``s`` validates: ``run``, the required groups (``partition``), its own group,
    the groups of its ``reads`` and ``needs``, and theirs in turn (their checks run too)."""
    known = stages()
    todo = [t.name for t in known.values() if t.required] + [stage(s).name if isinstance(s, str) else s.name]
    groups = ["run"]
    while todo:
        name = todo.pop(0)
        if name in groups:
            continue
        groups.append(name)
        if name in known:
            todo += [key.split(".")[0] for key in known[name].reads] + list(known[name].needs)
    return tuple(groups)


def named_federation(p: Any, path: str, name: str) -> Any:
    """The spec of federation ``name`` that the key ``path`` names; ValueError listing the defined ones."""
    known = p.partition.federations
    if name not in known:
        defined = sorted(known) if known else "none (partition.federations is empty: no feature track)"
        raise ValueError(f"{path}: unknown federation {name!r}; defined: {defined}")
    return known[name]


def server_split_federation(p: Any, path: str, name: str, n_validation: int,
                            validation_key: str | None = None) -> Any:
    """:func:`named_federation`, which must also have a server test split with more rows than the
    ``n_validation`` a stage cuts from it as its validation set (``validation_key`` names that setting in
    the error; by default ``<path>: validation_samples``)."""
    spec = named_federation(p, path, name)
    if spec.scheme == "by_dataset":
        raise ValueError(f"{path}: {name!r} has scheme 'by_dataset' (no server test split)")
    if n_validation >= spec.test_samples:
        raise ValueError(f"{validation_key or f'{path}: validation_samples'} ({n_validation}) must be smaller than "
                         f"partition.federations.{name}.test_samples ({spec.test_samples})")
    return spec


class _ParamsBase(Strict):
    """Base of :class:`Params`: after every group validates, each stage checks its cross-group references."""

    @model_validator(mode="after")
    def _references(self) -> "_ParamsBase":
        for s in stages().values():
            if s.check is not None and getattr(self, s.name, None) is not None:
                s.check(self)
        return self


@cache
def params_model(only: frozenset[str] | None = None, require: frozenset[str] = frozenset()) -> type[BaseModel]:
    """The whole params.yaml: ``run`` plus one optional group per stage (required ones, and those in
    ``require``, must be present); with ``only``, just those groups (one stage's view, :func:`groups_of`)."""
    fields: dict[str, Any] = {"run": (RunParams, RunParams())}
    for s in stages().values():
        if only is not None and s.name not in only:
            continue
        needed = s.required or s.name in require
        fields[s.name] = (s.params, ...) if needed else (typing.Optional[s.params], None)
    return create_model("Params", __base__=_ParamsBase, **fields)


if typing.TYPE_CHECKING:
    Params = Any  # noqa: N816 — the dynamic model of :func:`params_model`
else:
    def __getattr__(name: str) -> Any:  # ``from stages.params import Params``
        if name == "Params":
            return params_model()
        raise AttributeError(name)


# ------------------------------------------------------------------------------------------ errors
def _union_member(annotation: Any, tag: str) -> type[BaseModel] | None:
    """The member of a discriminated union whose ``scheme`` literal is ``tag`` (e.g. a federation spec)."""
    for arg in typing.get_args(annotation) or (annotation,):
        for inner in typing.get_args(arg) or (arg,):
            if isinstance(inner, type) and issubclass(inner, BaseModel) and "scheme" in inner.model_fields:
                if tag in typing.get_args(inner.model_fields["scheme"].annotation):
                    return inner
    return None


def _models_in(annotation: Any) -> list[Any]:
    """Every annotation nested in ``annotation`` (Optional, dict values, lists, Annotated)."""
    out, stack = [], [annotation]
    while stack:
        a = stack.pop()
        out.append(a)
        stack.extend(typing.get_args(a))
    return out


def _leading_key(message: str) -> str | None:
    """The dotted key path a message starts with (``fed_distance.clustering.federations: unknown …``), if any:
    the checks across groups (a federation name that must exist) raise from the top level, with no location."""
    found = re.match(r"([A-Za-z_]\w*(?:\.\w+|\[\d+\])+): ", message)
    return found.group(1) if found else None


def _format_error(err: dict[str, Any], data: Any) -> tuple[str, str]:
    loc = [str(x) for x in err["loc"]]
    parts: list[str] = []
    node = data
    for part in loc:
        if part == "[key]":  # a mapping key that failed validation (e.g. an unknown text task)
            continue
        if isinstance(node, dict) and part in node:
            parts.append(part)
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            parts.append(f"[{part}]")
            node = node[int(part)]
        elif (isinstance(node, dict) and node.get("scheme") == part) or _is_type_tag(part):
            continue  # a union branch name, not a key the user wrote
        else:
            parts.append(part)  # the unknown or missing key itself
    path = ".".join(parts).replace(".[", "[")
    msg = "required key is missing" if err["type"] == "missing" else plain_message(err)
    if loc and loc[-1] == "[key]":
        msg = f"invalid key: {msg}"
    got = err.get("input")
    if err["type"] not in {"missing", "extra_forbidden"} and not isinstance(got, (dict, list)) and "(got" not in msg:
        msg += f" (got {got!r})"
    return path, msg


def _is_type_tag(part: str) -> bool:
    """pydantic's names for union branches of plain types (``str``, ``literal['random']``, ``list[int]`` …)."""
    return part in {"str", "int", "float", "bool", "none"} or part.startswith(("literal[", "list[", "function-"))


def _models(annotation: Any) -> list[type[BaseModel]]:
    return [c for c in _models_in(annotation) if isinstance(c, type) and issubclass(c, BaseModel)]


def _allowed_at(loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed in the mapping that contains the (unknown) key at ``loc``."""
    annotation: Any = params_model()
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # a list index
        field = next((m.model_fields[part] for m in _models(annotation) if part in m.model_fields), None)
        if field is not None:
            annotation = field.annotation
            continue
        member = next((m for m in (_union_member(a, str(part)) for a in _models_in(annotation)) if m), None)
        if member is not None:  # a union branch tag (a federation's scheme)
            annotation = member
        # else: a mapping key chosen by the user (a federation name): the value type is inside annotation
    models = _models(annotation)
    return sorted(models[0].model_fields) if models else []


def validate_params(data: Any, source: str = "params.yaml", stage: Stage | str | None = None) -> Any:
    """Validate a parsed params mapping; raise ConfigError with one line per problem (key path + allowed).

    With ``stage``, only the groups of :func:`groups_of` are validated and the stage's own must be present;
    the other stages' groups are not read and not in the result. Unknown top-level keys are errors either way.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping of stage groups, got {type(data).__name__}")
    model = params_model()
    if stage is not None:
        groups = groups_of(stage)
        data = {k: v for k, v in data.items() if k in groups or k not in model.model_fields}
        own = stage if isinstance(stage, str) else stage.name
        model = params_model(frozenset(groups), frozenset({own}))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines, keys = [], []
        for err in exc.errors():
            path, msg = _format_error(err, data)
            if err["type"] == "extra_forbidden":
                msg += f"; allowed keys here: {', '.join(_allowed_at(err['loc']))}"
            lines.append(f"{source}: {path}: {msg}" if path else f"{source}: {msg}")
            named = path or _leading_key(msg)  # a cross-reference check names its key at the message's start
            if named:
                keys.append(named)
        # union branches can repeat the same complaint; keep order, drop duplicates
        raise ConfigError("\n".join(dict.fromkeys(lines)), keys=tuple(dict.fromkeys(keys))) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses a key repeated in one mapping (plain YAML keeps the last silently).
    Merge keys (``<<: *anchor``) are YAML's own: the keys written beside one override the merged ones, as in
    every YAML reader (DVC's too), and only the keys written in the mapping itself must be distinct."""


MERGE_TAG = "tag:yaml.org,2002:merge"


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == MERGE_TAG:  # ``<<``: merged by construct_mapping below, not a key of its own
            continue
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key] + 1}, again on line "
                            f"{key_node.start_mark.line + 1}): YAML would keep only the last one", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def read_params_file(path: str | Path) -> Any:
    """The parsed params file: ConfigError naming the file when it is missing, not YAML, or repeats a key."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found (run from the repository root)")
    try:
        return yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.constructor.ConstructorError as exc:
        if (exc.problem or "").startswith("duplicate key"):
            raise ConfigError(f"{path}: {exc.problem}") from None
        raise ConfigError(f"{path}: not valid YAML: {exc}".replace("\n", " ")) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}".replace("\n", " ")) from None


def load_params(path: str | Path = "params.yaml", stage: Stage | str | None = None) -> Any:
    """Read and validate params.yaml (one group per stage; see the comments in the file) — only the groups
    ``stage`` needs when one is given (:func:`validate_params`). A key given twice in one group is an error."""
    return validate_params(read_params_file(path), source=str(path), stage=stage)


def main(argv: list[str] | None = None) -> int:
    """``python -m stages.params [FILE]``: validate the whole params file (every group, whether or not a stage
    will read it) — ``make pipeline`` and ``otfed repro`` run it before ``dvc repro``, which skips the stages
    that are not stale and so would never read a misspelt key. One ``error:`` line per problem, exit 2."""
    argv = sys.argv[1:] if argv is None else argv
    path = argv[0] if argv else "params.yaml"
    try:
        load_params(path)
    except ConfigError as exc:
        for line in str(exc).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
