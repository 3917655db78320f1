"""Text data of the KNOT track: the three tasks' parties, read from data/raw and split deterministically.

KNOT (COLING 2022, §6 "Datasets") evaluates federated distillation on three
tasks. Each task has K **local** parties (private teachers), one **global** party (the server's own
labelled data, used to pretrain the student: learning without forgetting) and an unlabelled
**transfer** set on which the teachers' predictions are distilled:

====  ==========================================  ==================  ======================
task  locals                                      global              transfer (labels dropped)
====  ==========================================  ==================  ======================
sa    Amazon categories (paper: Cell, Clothing,   baby (paper: Food)  grocery_food
      Toys; here cell_phones, musical_instruments,
      digital_music)
erc   DailyDialog chunks 1 and 2, MELD            DailyDialog ch. 3   DailyDialog chunk 4
nli   MultiNLI genres fiction, government,        SNLI                ANLI
      slate, telephone, travel
====  ==========================================  ==================  ======================

The embedded files are real subsamples (data/README.md, PROVENANCE §1–3, §5). Labels become indices
into the task's label order, ``LabelSpace.for_task(task).labels`` (SA stars 1..5 → 0..4; ERC
neutral → "no emotion", joy → "happiness"; NLI entailment / neutral / contradiction).

**The transfer set carries no labels.** Its rows are separated from the labelled parties before any
label is looked at (ANLI is read without its label column at all): no function here returns, stores or
even validates a transfer label — except for the **audit slice**, ``spec.audit`` transfer texts (0 by
default) drawn uniformly with their own seeded generator, whose labels alone are kept
(``TextFederation.audit_index`` / ``audit_labels``, ``audit.csv.gz``) to check whether the teachers are
informative on the transfer set; they are never trained on.

Each labelled party is split train / val / test (seeded): stratified by label for SA and NLI; by whole
dialogue for the DailyDialog chunks (no dialogue in two splits); MELD keeps its own train / dev / test
split. Caps (``max_train``, ``max_eval``, ``max_transfer``) then subsample stratified by label
(uniformly for the transfer set, whose labels are unknown). Every party draws from its own generator
seeded by ``(seed, task, party name)``, so a party's rows do not change when another party is added.

Modules: :mod:`~otfed.data.text.spec` (tasks, datasets, :class:`TextTaskSpec`), :mod:`~otfed.data.text.federation`
(the values: :class:`TextSplit`, :class:`TextParty`, :class:`TextFederation`, table 1 sizes),
:mod:`~otfed.data.text.raw` (readers of the raw files), :mod:`~otfed.data.text.splits` (seeded train/val/test
splits and caps), :mod:`~otfed.data.text.build` (:func:`build_text_federation`) and
:mod:`~otfed.data.text.store` (the partition files the text-track stages share).
"""

from otfed.data.text.build import build_text_federation
from otfed.data.text.federation import TextFederation, TextParty, TextSplit, federation_summary
from otfed.data.text.raw import RAW_FILES, RAW_LABELS
from otfed.data.text.spec import (DATASET_PARTIES, DEFAULT_CAPS, ROLES, SPLITS, TASKS, TextTask, TextTaskSpec,
                                  default_spec, label_names)
from otfed.data.text.store import FORMAT, load_text_federation, save_text_federation

__all__ = [
    "TASKS",
    "TextTask",
    "SPLITS",
    "ROLES",
    "FORMAT",
    "RAW_FILES",
    "RAW_LABELS",
    "DATASET_PARTIES",
    "DEFAULT_CAPS",
    "TextTaskSpec",
    "default_spec",
    "label_names",
    "TextSplit",
    "TextParty",
    "TextFederation",
    "federation_summary",
    "build_text_federation",
    "save_text_federation",
    "load_text_federation",
]
