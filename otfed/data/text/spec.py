"""The KNOT tasks, their datasets and default party layouts, and :class:`TextTaskSpec` — which parties a task
has and how they are sized (KNOT §6 "Datasets"). ``TextTaskSpec`` is also the
``partition.text.tasks.<task>`` params group.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from otfed.errors import ConfigError
from otfed.label_space import TASK_COORDINATES
from otfed.schema import Strict

TASKS: tuple[str, ...] = ("sa", "erc", "nli")
TextTask = Literal["sa", "erc", "nli"]  # a KNOT task: sentiment, emotion (ERC), NLI
SPLITS: tuple[str, ...] = ("train", "val", "test")
ROLES: tuple[str, ...] = ("local", "global")

#: task → dataset → default (locals, global party, transfer). The first dataset is the task's default.
DATASET_PARTIES: dict[str, dict[str, tuple[tuple[str, ...], str, str]]] = {
    "sa": {
        "amazon_categories": (("cell_phones", "musical_instruments", "digital_music"), "baby", "grocery_food"),
        "womens_clothing": (("tops", "dresses", "bottoms"), "intimate", "jackets"),
        "mdsd_amazon4": (("books", "dvd"), "electronics", "kitchen"),
    },
    "erc": {"dailydialog": (("dd_chunk1", "dd_chunk2", "meld"), "dd_chunk3", "dd_chunk4")},
    "nli": {"multinli": (("fiction", "government", "slate", "telephone", "travel"), "snli", "anli")},
}

#: CPU-sized caps used by :func:`default_spec` (paper-scale runs set them to None).
DEFAULT_CAPS: dict[str, int] = {"max_train": 800, "max_eval": 300, "max_transfer": 1000}


class TextTaskSpec(Strict):
    """Which parties a KNOT task has and how they are sized (KNOT §6) — also the ``partition.text.tasks.<task>``
    params group (there ``task`` is the group's key).

    Domain names: SA — the ``domain`` values of the dataset's file; ERC — ``dd_chunk1`` … ``dd_chunk4``
    (DailyDialog cut into 4 contiguous chunks) and ``meld``; NLI — MultiNLI ``genre`` values, ``snli``
    and ``anli``. Caps: ``None`` = no cap.
    """

    task: TextTask
    dataset: str = Field(description="sa: amazon_categories | womens_clothing | mdsd_amazon4; erc: dailydialog; "
                                     "nli: multinli.")
    locals: tuple[str, ...] = Field(min_length=1, strict=False,  # a YAML / JSON list
                                    description="Local clients (domains, genres or DailyDialog chunks).")
    global_party: str = Field(description="The server's labelled dataset (pretrains the global model).")
    transfer: str | None = Field(description="Unlabelled transfer set: a domain whose labels are dropped when it is "
                                             "read (but for the audit slice), or null = texts held out of the "
                                             "labelled parties' own domains (rows of their train splits that no "
                                             "party trains on).")
    max_train: int | None = Field(None, ge=1, description="Cap on train rows per party (stratified); None = all.")
    train_sizes: dict[str, int] = Field(default_factory=dict,
                                        description="Train rows of named parties (stratified), overriding max_train: "
                                                    "unequal local sizes, a global party with little labelled data.")
    max_eval: int | None = Field(None, ge=1, description="Cap on validation and on test rows per party.")
    max_transfer: int | None = Field(None, ge=1, description="Cap on transfer texts.")
    audit: int = Field(0, ge=0, description="Transfer texts whose labels are kept aside for diagnostics only "
                                            "(are the teachers informative?), never for training: drawn "
                                            "uniformly without replacement, seeded, without looking at labels; "
                                            "0 = none. At most the number of transfer texts.")
    val_fraction: float = Field(0.1, gt=0.0, lt=1.0)
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    context_turns: int = Field(2, ge=0, le=20, description="ERC: preceding turns prepended to an utterance.")
    separator: str = Field(" [SEP] ", min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> "TextTaskSpec":
        if self.dataset not in DATASET_PARTIES[self.task]:
            raise ValueError(f"dataset: unknown dataset {self.dataset!r}; allowed: "
                             f"{', '.join(DATASET_PARTIES[self.task])}")
        names = [*self.locals, self.global_party, *([] if self.transfer is None else [self.transfer])]
        if not all(names):
            raise ValueError(f"locals: party names must be non-empty strings; got {names}")
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"a dataset can play one role only; repeated: {', '.join(repeated)}")
        labelled = [*self.locals, self.global_party]
        unknown = sorted(set(self.train_sizes) - set(labelled))
        if unknown:
            raise ValueError(f"train_sizes: {', '.join(unknown)} not a party of this task; parties: "
                             f"{', '.join(labelled)}")
        bad = {k: v for k, v in self.train_sizes.items() if isinstance(v, bool) or v < 1}
        if bad:
            raise ValueError(f"train_sizes: sizes must be integers ≥ 1; got {bad}")
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError(f"test_fraction: val_fraction + test_fraction must be < 1; got "
                             f"{self.val_fraction} + {self.test_fraction}")
        return self

    def train_cap(self, party: str) -> int | None:
        """Train rows kept for ``party``: its ``train_sizes`` entry, else ``max_train``."""
        return self.train_sizes.get(party, self.max_train)


def default_spec(task: str, **overrides: Any) -> TextTaskSpec:
    """The KNOT §6 party layout of ``task`` with CPU-sized caps (:data:`DEFAULT_CAPS`).

    ``dataset=`` picks the dataset's own default parties (e.g. ``default_spec("sa",
    dataset="womens_clothing")``); any other field can be overridden by name.
    """
    if task not in TASKS:
        raise ConfigError(f"text spec: unknown task {task!r}; allowed: {', '.join(TASKS)}")
    names = set(TextTaskSpec.model_fields) - {"task"}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ConfigError(f"text spec {task}: unknown field(s) {', '.join(unknown)}; allowed: "
                          f"{', '.join(sorted(names))}")
    dataset = overrides.get("dataset", next(iter(DATASET_PARTIES[task])))
    if dataset not in DATASET_PARTIES[task]:
        raise ConfigError(f"text spec {task}.dataset: unknown dataset {dataset!r}; allowed: "
                          f"{', '.join(DATASET_PARTIES[task])}")
    locals_, global_party, transfer = DATASET_PARTIES[task][dataset]
    values: dict[str, Any] = dict(task=task, dataset=dataset, locals=locals_, global_party=global_party,
                                  transfer=transfer, **DEFAULT_CAPS)
    values.update(overrides)
    return TextTaskSpec(**values)


def label_names(task: str) -> tuple[str, ...]:
    """The task's label order, ``LabelSpace.for_task(task).labels`` (KNOT fig. 3)."""
    return tuple(TASK_COORDINATES[task][0])
