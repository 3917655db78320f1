"""Stage ``partition`` — the embedded data (``data/raw``) split into the federations every later stage reads.

Feature track: each named federation of ``partition.federations`` (one client per dataset, iid, Dirichlet,
class pairs, FedBary cases 1–5 with ground truth) → ``data/partitions/<name>.npz`` + ``manifest.json``.
Text track (KNOT §6): each task of ``partition.text.tasks`` → ``data/text_partitions/<task>/`` (local
clients, the server's global dataset, the unlabelled transfer set). One job per federation and per task.
Either track may be left out (no ``federations`` or no ``text``), not both.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import pandas as pd
from pydantic import Field, field_validator, model_validator

from otfed import io
from otfed.data.features import check_pca_components
from otfed.data.federations import FederationSpec, build_federation, check_image_shapes
from otfed.data.images import IMAGE_DATASETS, SPLITS, load_images
from otfed.data.store import save_federation
from otfed.data.text import TextTask, TextTaskSpec, build_text_federation, federation_summary, save_text_federation
from otfed.data.text.raw import RAW_FILES, SOURCES, read_columns
from otfed.errors import ConfigError
from otfed.figures.partition import class_histograms
from otfed.schema import Strict
from stages import layout
from stages.stage import Job, Report, Results, Stage

if TYPE_CHECKING:
    from stages.params import Params

# the folders this stage writes (declared in stages/layout.py); the first holds its reports and metrics.json
OUTPUTS = (layout.PARTITION_REPORTS, layout.PARTITIONS, layout.TEXT_PARTITIONS)


# ------------------------------------------------------------------------------------------ params
class TextPartitionParams(Strict):
    """Text partitions: ``data/text_partitions/<task>/{parties.csv.gz, transfer.csv.gz, manifest.json}``."""

    tasks: dict[TextTask, TextTaskSpec] = Field(min_length=1, description="sa | erc | nli → its parties.")

    @field_validator("tasks", mode="before")
    @classmethod
    def _task_from_key(cls, v: Any) -> Any:
        """Each task's spec takes its ``task`` from its key (``sa:`` → task 'sa')."""
        if isinstance(v, dict):
            return {k: ({"task": k, **s} if isinstance(s, dict) and "task" not in s else s) for k, s in v.items()}
        return v

    @field_validator("tasks")
    @classmethod
    def _keys_are_tasks(cls, v: dict[str, TextTaskSpec]) -> dict[str, TextTaskSpec]:
        for key, spec in v.items():
            if key != spec.task:
                raise ValueError(f"{key}: task {spec.task!r} under key {key!r}; the key is the task")
        return v


class PartitionParams(Strict):
    """Stage ``partition``: named federations of the embedded image data, and the KNOT text tasks."""

    data_dir: str = "data/raw"
    federations: dict[str, FederationSpec] = Field({}, description="Feature track: name → spec; none = text "
                                                   "track only.")
    text: TextPartitionParams | None = Field(None, description="KNOT text track; None = feature track only.")

    @model_validator(mode="after")
    def _a_track(self) -> "PartitionParams":
        if not self.federations and self.text is None:
            raise ValueError("needs federations (feature track), text (text track) or both")
        return self

    @field_validator("federations")
    @classmethod
    def _names(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name in v:
            if not name.replace("_", "").isalnum():
                raise ValueError(f"federation name {name!r} must be letters, digits and underscores")
        return v


def image_datasets(part: PartitionParams) -> list[str]:
    """The embedded image datasets the configured federations draw from, each once."""
    return list(dict.fromkeys(d for spec in part.federations.values()
                              for d in (spec.datasets if spec.scheme == "by_dataset" else [spec.dataset])))


def raw_files(part: PartitionParams) -> list[Path]:
    """The embedded files of ``data_dir`` this stage reads for the federations and text tasks configured."""
    names = [IMAGE_DATASETS[d] for d in image_datasets(part)]
    if part.text is not None:
        names += [RAW_FILES[s.dataset] for spec in part.text.tasks.values() for s in SOURCES[(spec.task, spec.dataset)]]
    return [Path(part.data_dir) / name for name in dict.fromkeys(names)]


def inputs(p: Params) -> list[Path]:
    """The stage's input files: :func:`raw_files` (checked to exist and be readable before :func:`preflight`)."""
    return raw_files(p.partition)


def preflight(p: Params) -> None:
    """Every raw file the configured federations and tasks read opens and has the expected keys / columns,
    labels in range, as many labels as images (:func:`~otfed.data.images.load_images`), the images each
    federation draws from give one feature size (:func:`~otfed.data.federations.check_image_shapes`) and hold
    the rows its sizes (:func:`check_row_counts`) and its PCA (:func:`check_pca`) ask for — checked before any
    server starts (DataFileError naming the file, ConfigError naming the key, otherwise)."""
    part = p.partition
    images = {(name, split): load_images(name, split, part.data_dir).images.shape
              for name in image_datasets(part) for split in SPLITS}
    shapes = {key: shape[1:] for key, shape in images.items()}
    for name, spec in part.federations.items():
        check_image_shapes(name, spec, shapes, part.data_dir)
        check_row_counts(name, spec, {key: shape[0] for key, shape in images.items()}, part.data_dir)
        check_pca(name, spec, images, part.data_dir)
    for path in raw_files(part):
        if path.name.endswith(".csv.gz"):
            read_columns(path, [])  # the header parses and the whole gzip stream decompresses


def check_row_counts(name: str, spec: FederationSpec, rows: Mapping[tuple[str, str], int], data_dir: str) -> None:
    """ConfigError naming the key, the rows there are and the file unless federation ``name`` asks for no more
    rows than its image splits hold (``rows``: (dataset, split) → row count): ``samples`` and a by-dataset
    ``samples_per_client`` at most the train split's rows, a FedBary case's ``n_clients × samples_per_client``
    too (its clients are disjoint), ``test_samples`` at most the test split's. Partitioning would otherwise
    take every row there is and write the larger number asked for into the manifest."""
    key = f"partition.federations.{name}"

    def refuse(field: str, asked: str, dataset: str, split: str, allowed: str = "") -> None:
        path, n = Path(data_dir) / IMAGE_DATASETS[dataset], rows[(dataset, split)]
        raise ConfigError(f"{key}.{field}: {asked}, but {path} holds {n} {split} rows (x_{split}); "
                          f"{allowed or f'at most {n}'}", keys=(f"{key}.{field}",))

    if spec.scheme == "by_dataset":
        for dataset in spec.datasets:
            if spec.samples_per_client > rows[(dataset, "train")]:
                refuse("samples_per_client", f"{spec.samples_per_client} rows per dataset", dataset, "train")
        return
    train = rows[(spec.dataset, "train")]
    if spec.scheme == "fedbary_case" and spec.n_clients * spec.samples_per_client > train:
        refuse("samples_per_client", f"{spec.n_clients} clients × {spec.samples_per_client} rows = "
               f"{spec.n_clients * spec.samples_per_client} rows", spec.dataset, "train",
               f"at most {train // spec.n_clients} per client")
    samples = getattr(spec, "samples", None)
    if samples is not None and samples > train:
        refuse("samples", f"{samples} rows (null: every row)", spec.dataset, "train")
    if spec.test_samples > rows[(spec.dataset, "test")]:
        refuse("test_samples", f"{spec.test_samples} rows", spec.dataset, "test")


def check_pca(name: str, spec: FederationSpec, images: Mapping[tuple[str, str], tuple[int, ...]],
              data_dir: str) -> None:
    """ConfigError naming ``partition.federations.<name>.pca_components`` unless the PCA fits the rows it is
    fitted on (:func:`~otfed.data.features.check_pca_components`): the server's test split (``test_samples``
    rows), or — one client per dataset, or no test rows — the train rows drawn (not checked for a FedBary case
    without test rows: its pool size depends on the case). ``images``: (dataset, split) → the images' shape."""
    if not spec.pca_components:
        return
    first = spec.datasets[0] if spec.scheme == "by_dataset" else spec.dataset
    shape = images[(first, "train")][1:]
    side = (spec.image_size, spec.image_size) if spec.image_size else shape[:2]
    d = side[0] * side[1] * (shape[2] if len(shape) == 3 else 1)
    if spec.scheme == "by_dataset":
        n = sum(min(spec.samples_per_client, images[(x, "train")][0]) for x in spec.datasets)
        reference = f"the {n} train rows drawn from {', '.join(spec.datasets)}"
    elif spec.test_samples:
        n, reference = spec.test_samples, f"the server's test split of {Path(data_dir) / IMAGE_DATASETS[first]}"
    elif spec.scheme != "fedbary_case":
        n = spec.samples or images[(first, "train")][0]
        reference = f"the train rows drawn from {Path(data_dir) / IMAGE_DATASETS[first]} (no test rows)"
    else:
        return
    check_pca_components(spec.pca_components, n, d, f"partition.federations.{name}.pca_components", reference)


# -------------------------------------------------------------------------------------------- jobs
def jobs(p: Params, dirs: Mapping[str, Path]) -> list[Job]:
    """One job per federation, then one per text task, each writing into the staged output folders."""
    part, seed = p.partition, p.run.seed
    out = [Job(f"federation {name}", federation_job,
               dict(name=name, spec=spec, data_dir=part.data_dir, seed=seed, out_dir=str(dirs[layout.PARTITIONS])),
               key=("federation", name))
           for name, spec in part.federations.items()]
    if part.text is not None:
        out += [Job(f"text {task}", text_task_job,
                    dict(spec=spec, data_dir=part.data_dir, seed=seed, out_dir=str(dirs[layout.TEXT_PARTITIONS])),
                    key=("text", task))
                for task, spec in part.text.tasks.items()]
    return out


def federation_job(name: str, spec: FederationSpec, data_dir: str, seed: int, out_dir: str) -> dict:
    """Partition one federation and write ``<out_dir>/<name>.npz``; returns its manifest entry."""
    data, entry = build_federation(name, spec, data_dir, seed)
    save_federation(data, out_dir)
    return {"federation": name, **entry}


def text_task_job(spec: TextTaskSpec, data_dir: str, seed: int, out_dir: str) -> pd.DataFrame:
    """Partition one KNOT task into parties (KNOT §6) and write ``<out_dir>/<task>/``; returns its summary."""
    fed = build_text_federation(spec, data_dir, seed)
    save_text_federation(fed, Path(out_dir) / spec.task)
    return federation_summary(fed).assign(task=spec.task)


# ------------------------------------------------------------------------------------------ report
def report(p: Params, results: Results, out: Report, dirs: Mapping[str, Path]) -> dict[str, Any]:
    """``manifest.json``, the per-client table, the class-histogram figure, the text parties table (each
    track's only when it is configured; ``manifest.json`` always, empty without federations)."""
    manifest = {}
    for entry in results.of("federation"):
        entry = dict(entry)
        manifest[entry.pop("federation")] = entry
    io.write_json(manifest, dirs[layout.PARTITIONS] / "manifest.json")
    rows = [dict(federation=f, client=c["name"], group=c["group"], n_train=c["n_train"], n_val=c["n_val"],
                 n_corrupted=c["n_corrupted"], classes=int(np.count_nonzero(c["class_counts"])))
            for f, e in manifest.items() for c in e["clients"]]
    summary = {"federations": len(manifest), "clients": len(rows), "rows": 0, "corrupted": 0}
    if rows:
        table = pd.DataFrame(rows)
        out.table(table, "clients.csv")
        out.figure(class_histograms(manifest), "class_histograms.png")
        summary.update(rows=int(table.n_train.sum() + table.n_val.sum()), corrupted=int(table.n_corrupted.sum()))
    text_results = results.of("text")
    if text_results:
        text_table = pd.concat(text_results, ignore_index=True)
        text_table = text_table[["task", *[c for c in text_table.columns if c != "task"]]]
        out.table(text_table, "text_parties.csv")
        summary["text_tasks"] = len(text_results)
        summary["text_rows"] = int(text_table["n"].sum())
    out.artifact(dirs[layout.PARTITIONS] / "manifest.json")
    return summary


STAGE = Stage("partition", PartitionParams, OUTPUTS, jobs, report, required=True, preflight=preflight,
              inputs=inputs, headline=("federations", "clients", "rows", "corrupted", "text_tasks", "text_rows"))
