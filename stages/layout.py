"""Every folder a stage writes, declared once (relative to the repository root, where DVC runs).

``dvc.yaml`` outs are checked against these (``tests/test_dvc_graph.py``); a stage reads an earlier
stage's results only through these folders.
"""
from __future__ import annotations

PARTITIONS = "data/partitions"                # partition: <federation>.npz + manifest.json
TEXT_PARTITIONS = "data/text_partitions"      # partition: <task>/{parties,transfer}.csv.gz + manifest.json
TEXT_MODELS = "models/text"                   # train_teachers: <task>/<party>/ model + tokenizer
TEXT_MESSAGES = "data/text_messages"          # train_teachers: <task>.npz, what left the KNOT clients
TEXT_BIAS = "data/text_bias"                  # estimate_bias: <task>.npz, the bias messages B_k


def reports(stage_folder: str) -> str:
    """The reports folder ``reports/<stage_folder>`` (tables, figures, metrics.json)."""
    return f"reports/{stage_folder}"


PARTITION_REPORTS = reports("partition")
FED_DISTANCE_REPORTS = reports("fed_distance")
VALUATION_REPORTS = reports("valuation")
REMOVAL_REPORTS = reports("removal")
TEACHER_REPORTS = reports("teachers")
BIAS_REPORTS = reports("bias")
DISTILL_REPORTS = reports("distill")
