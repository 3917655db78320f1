"""The schema of ``params.yaml``: one pydantic model per stage group, validated before any work starts.

Every model forbids unknown keys, so a typo fails loudly. :func:`load_params` turns pydantic's errors into
a single line per problem that names the key path and what is allowed, and raises
:class:`~otfed.errors.ConfigError`; stages print it and exit with status 2 without writing anything.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from otfed.errors import ConfigError

ImageDataset = Literal["mnist", "fashionmnist", "kmnist", "usps", "cifar10"]
PositiveInt = Annotated[int, Field(ge=1)]  # list items: errors name the index, e.g. toy.dims[1]


def _interpolation_time(v: Any) -> Any:
    if isinstance(v, float) and not 0.0 < v < 1.0:
        raise ValueError(f"must be 'random' or a number in (0, 1) (got {v})")
    return v


InterpolationTime = Annotated[Union[Literal["random"], float], AfterValidator(_interpolation_time)]


class Strict(BaseModel):
    """Base for every params group: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --------------------------------------------------------------------------------------------- run
class RunParams(Strict):
    """Settings shared by every stage."""

    seed: int = Field(0, ge=0, description="Global seed; the same params give the same numbers twice.")
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N — where torch code runs.")
    task_runner: Literal["thread", "sequential"] = "thread"
    max_workers: int = Field(2, ge=1, le=256)

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v in {"auto", "cpu", "cuda"} or (v.startswith("cuda:") and v[5:].isdigit()):
            return v
        raise ValueError(f"must be one of auto, cpu, cuda, cuda:N (got {v!r})")


# ----------------------------------------------------------------------------------------- partition
class _FederationBase(Strict):
    dataset: ImageDataset = "mnist"
    image_size: int | None = Field(None, ge=4, le=64, description="Resize images to size×size (USPS 16→28).")
    pca_components: int = Field(0, ge=0, description="0 = raw pixels; else PCA fitted on the public test split.")
    val_fraction: float = Field(0.1, ge=0.0, lt=1.0)
    test_samples: int = Field(1000, ge=0, description="Server-side test samples (official test split).")


class ByDatasetFederation(_FederationBase):
    """One client per dataset (federated OTDD between datasets, FedWaD fig. 6)."""

    scheme: Literal["by_dataset"]
    datasets: list[ImageDataset] = Field(min_length=2)
    samples_per_client: int = Field(1000, ge=10, le=5000)


class IidFederation(_FederationBase):
    scheme: Literal["iid"]
    n_clients: int = Field(ge=1, le=1000)
    samples: int | None = Field(None, ge=1, description="Train samples used in all (None = all).")


class DirichletFederation(_FederationBase):
    scheme: Literal["dirichlet"]
    n_clients: int = Field(ge=1, le=1000)
    alpha: float = Field(gt=0.0)
    samples: int | None = Field(None, ge=1)


class ClassPairsFederation(_FederationBase):
    """FedWaD 'boosting FL' partition: strong structure (fixed pairs) or none (random pair per client)."""

    scheme: Literal["class_pairs"]
    n_clients: int = Field(ge=10, le=1000)
    structure: Literal["strong", "none"]
    samples: int | None = Field(None, ge=1)


class FedBaryCaseFederation(_FederationBase):
    """FedBary client cases 1–5 (SPEC §3) with ground-truth corrupted indices."""

    scheme: Literal["fedbary_case"]
    case: int = Field(ge=1, le=5)
    n_clients: int = Field(5, ge=2, le=100)
    samples_per_client: int = Field(200, ge=10)
    noise_std: float = Field(1.0, gt=0.0, description="Feature-noise std (case 5), in [0,1]-pixel units.")


FederationSpec = Annotated[
    Union[ByDatasetFederation, IidFederation, DirichletFederation, ClassPairsFederation, FedBaryCaseFederation],
    Field(discriminator="scheme"),
]


# ---------------------------------------------------------------------------- partition (text track)
TextTask = Literal["sa", "erc", "nli"]
TEXT_TASKS: tuple[str, ...] = ("sa", "erc", "nli")


class TextTaskParams(Strict):
    """One KNOT task's parties (SPEC §1): local clients, the global (server) dataset and the transfer set."""

    dataset: str = Field(description="sa: amazon_categories | womens_clothing | mdsd_amazon4; erc: dailydialog; "
                                     "nli: multinli.")
    locals: list[str] = Field(min_length=1, description="Local clients (domains, genres or DailyDialog chunks).")
    global_party: str = Field(description="The server's labelled dataset (pretrains the global model).")
    transfer: str = Field(description="Unlabelled transfer set: its labels are dropped when it is read.")
    max_train: int | None = Field(None, ge=10, description="Cap on train rows per party (stratified); None = all.")
    max_eval: int | None = Field(None, ge=10, description="Cap on validation and on test rows per party.")
    max_transfer: int | None = Field(None, ge=10, description="Cap on transfer texts.")
    val_fraction: float = Field(0.1, gt=0.0, lt=0.5)
    test_fraction: float = Field(0.2, gt=0.0, lt=0.5)
    context_turns: int = Field(2, ge=0, le=20, description="ERC: preceding turns prepended to an utterance.")
    separator: str = " [SEP] "

    @model_validator(mode="after")
    def _distinct_parties(self) -> "TextTaskParams":
        names = [*self.locals, self.global_party, self.transfer]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"a dataset can play one role only; repeated: {', '.join(repeated)}")
        return self


class TextPartitionParams(Strict):
    """Text partitions: ``<out_dir>/<task>/{parties.csv.gz, transfer.csv.gz, manifest.json}``."""

    out_dir: str = "data/text_partitions"
    tasks: dict[TextTask, TextTaskParams] = Field(min_length=1)


class PartitionParams(Strict):
    data_dir: str = "data/raw"
    out_dir: str = "data/partitions"
    federations: dict[str, FederationSpec] = Field(min_length=1)
    text: TextPartitionParams | None = Field(None, description="KNOT text track; None = feature track only.")

    @field_validator("federations")
    @classmethod
    def _names(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name in v:
            if not name.replace("_", "").isalnum():
                raise ValueError(f"federation name {name!r} must be letters, digits and underscores")
        return v


# -------------------------------------------------------------------------------------- fed_distance
class FedWaDParams(Strict):
    """FedWaD Algorithm 1 settings."""

    support_size: int = Field(10, ge=1, le=20000, description="S, support of the interpolating measure ξ.")
    iterations: int = Field(20, ge=1, le=10000, description="K.")
    t: InterpolationTime = Field("random", description="'random' (default) or a fixed t in (0,1).")
    p: Literal[1, 2] = 2
    interpolation: Literal["approx", "exact"] = "approx"
    solver: Literal["auto", "network_simplex", "semidual_newton"] = Field(
        "auto", description="auto: network simplex for exact interpolation, semi-dual Newton for approx.")
    init_scale: float = Field(1.0, gt=0.0, description="ξ⁰ ~ N(0, init_scale² I).")

    @model_validator(mode="after")
    def _exact_needs_simplex(self) -> "FedWaDParams":
        if self.interpolation == "exact" and self.solver == "semidual_newton":
            raise ValueError("solver: exact interpolation needs 'network_simplex' (or 'auto')")
        return self


class ToyParams(Strict):
    """Toy Gaussians (FedWaD fig. 2–3): time and relative error vs n."""

    n_values: list[PositiveInt] = Field(min_length=1)
    supports: list[PositiveInt] = Field(min_length=1)
    ratios: list[PositiveInt] = Field([1, 3], min_length=1, description="n_ν = n_μ / ratio.")
    dims: list[PositiveInt] = Field([2, 50], min_length=1)
    iterations: int = Field(20, ge=1)
    exact_interp_max_n: int = Field(1000, ge=0, description="Skip exact-interpolation FedWaD above this n.")
    repeats: int = Field(1, ge=1)
    convergence_n: int = Field(500, ge=10, description="n for the A(k) convergence figure (fig. 3).")


class OTDDParams(Strict):
    """Federated OTDD between datasets (FedWaD fig. 6)."""

    federation: str = "otdd_benchmarks"
    diagonal: bool = True
    fedwad: FedWaDParams = FedWaDParams(support_size=200, iterations=20)


class ClusteringParams(Strict):
    """Pairwise federated OTDD between clients → spectral clustering (FedWaD §5, tables 1–5)."""

    federations: list[str] = Field(min_length=1)
    n_clusters: int = Field(5, ge=2)
    neighbors: list[int] = Field([3, 5], description="kNN graph sizes; the precomputed affinity always runs.")
    diagonal: bool = True
    fedwad: FedWaDParams = FedWaDParams(support_size=10, iterations=10)


class FedDistanceParams(Strict):
    toy: ToyParams
    otdd: OTDDParams = OTDDParams()
    clustering: ClusteringParams
    out_dir: str = "reports/fed_distance"


# ------------------------------------------------------------------------------ barycenter_valuation
class FedBaryParams(FedWaDParams):
    """FedBary Algorithm 1 settings (SPEC §3; otfed.federation.fedbary.FedBaryConfig): FedWaD's protocol
    settings (t, p, interpolation, solver, init_scale, and their checks) plus the barycenter options."""

    support_size: int = Field(50, ge=1, le=20000, description="S, atoms of every γ_i and of the barycenter.")
    iterations: int = Field(10, ge=1, le=10000, description="K.")
    barycenter_step: Literal["reweighted", "interpolants"] = "reweighted"
    diagonal: bool = True
    potential: Literal["sinkhorn", "exact"] = Field("sinkhorn", description="Dual potentials for datum values.")


class FedAvgParams(Strict):
    """FedAvg (softmax regression, or an MLP with ``hidden`` widths) used as a utility and for table 4."""

    rounds: int = Field(10, ge=1, le=10000)
    epochs: int = Field(5, ge=1, le=1000, description="Local epochs per round.")
    lr: float = Field(0.1, gt=0.0, le=10.0)
    batch_size: int | None = Field(None, ge=1, description="None = full batch.")
    hidden: list[PositiveInt] = Field([], description="Hidden widths; [] = multinomial logistic regression.")


class OutlierParams(Strict):
    """4 iid clients + 1 noisy client (fig. 4 histogram): feature noise planted on one client in-stage."""

    federation: str = "case1"
    client: int = Field(4, ge=0, description="Index of the client that gets the noise.")
    fraction: float = Field(0.5, gt=0.0, le=1.0, description="Share of its samples that get feature noise.")
    noise_std: float = Field(1.0, gt=0.0, description="N(0, std²) per pixel, before PCA.")


class ContributionParams(Strict):
    """Client contributions, cases 1–5: FedBary (with / without validation) vs FedAvg-utility games."""

    federations: list[str] = Field(["case1", "case2", "case3", "case4", "case5"], min_length=1)
    validation_samples: int = Field(300, ge=10, description="Server validation = the first rows of the test split.")
    monte_carlo_permutations: int = Field(10, ge=1, le=100000)
    fedavg: FedAvgParams = FedAvgParams()
    outlier: OutlierParams = OutlierParams()


class DetectionParams(Strict):
    """Noisy-datum detection (fig. 5): corruptions planted in-stage on a clean federation."""

    federation: str = "fmnist_clean"
    kinds: list[Literal["label", "feature"]] = Field(["label", "feature"], min_length=1)
    rates: list[float] = Field([0.05, 0.15, 0.30], min_length=1)
    noise_std: float = Field(1.0, gt=0.0, description="Feature-noise std per pixel, before PCA.")
    validation_samples: int = Field(300, ge=10, description="Server validation = first rows of the test split; "
                                    "the rest is the removal-curve holdout.")
    knn_k: int = Field(5, ge=1, description="K of KNN-Shapley and of leave-one-out's KNN utility.")
    removal_step: float = Field(0.05, gt=0.0, lt=1.0)
    removal_max_fraction: float = Field(0.5, gt=0.0, lt=1.0)

    @field_validator("rates")
    @classmethod
    def _rates(cls, v: list[float]) -> list[float]:
        if any(not 0.0 < r < 1.0 for r in v):
            raise ValueError("rates must lie in (0, 1)")
        return v

    @model_validator(mode="after")
    def _removal(self) -> "DetectionParams":
        if self.removal_step > self.removal_max_fraction:
            raise ValueError("removal_step must be ≤ removal_max_fraction")
        return self


class DuplicationParams(Strict):
    """Duplication robustness (table 3): one client's whole dataset, or one of its data, duplicated; exact W
    (POT) next to FedBary's estimate. The federation is checked by the stage before any work starts."""

    federation: str = "case1"
    client: int = Field(0, ge=0, description="Index of the client whose data are duplicated.")
    copies: list[PositiveInt] = Field([1, 2, 3, 4], min_length=1, description="Times the client's dataset "
                                      "appears: 1 = as is, 2–4 = duplicated 1–3×.")
    datum_copies: int = Field(11, ge=2, description="Times the most valuable / most harmful datum appears "
                              "(11 = duplicated 10×).")
    validation_samples: int = Field(300, ge=10, description="Q = the first rows of the test split.")
    seed_repeats: int = Field(5, ge=0, le=100, description="FedBary reruns with seeds seed … seed+n−1 on the "
                              "original data: the estimate's seed-to-seed spread.")


class BarycenterValuationParams(Strict):
    """Stage ``barycenter_valuation``: contributions (fig. 4), outlier histogram, detection (fig. 5),
    duplication robustness (table 3)."""

    out_dir: str = "reports/valuation"
    pca_components: int = Field(32, ge=0, description="0 = features as stored; else PCA fitted on the test split.")
    fedbary: FedBaryParams = FedBaryParams()
    contributions: ContributionParams = ContributionParams()
    detection: DetectionParams = DetectionParams()
    duplication: DuplicationParams = DuplicationParams()


class NoisyRemovalParams(Strict):
    """Stage ``noisy_removal`` (table 4): clients drop what FedBary flags; FedAvg before vs after."""

    out_dir: str = "reports/removal"
    federations: list[str] = Field(["fmnist_label_noise", "fmnist_feature_noise"], min_length=1)
    pca_components: int = Field(32, ge=0)
    validation_samples: int = Field(500, ge=10, description="Server validation = first rows of the test split; "
                                    "the rest is the test set.")
    max_remove_fraction: float = Field(1.0, gt=0.0, le=1.0,
                                       description="Cap on the share of a client's data it removes (top values).")
    fedbary: FedBaryParams = FedBaryParams()
    fedavg: FedAvgParams = FedAvgParams(rounds=20)


# ------------------------------------------------------------------------------- text track (KNOT)
class TextModelParams(Strict):
    """A text classifier (SPEC §1: a BERT-tiny-sized encoder + classifier; or a local HF checkpoint)."""

    kind: Literal["bert", "distilbert", "checkpoint"] = "bert"
    layers: int = Field(2, ge=1, le=48)
    hidden: int = Field(128, ge=8, le=4096)
    heads: int = Field(2, ge=1, le=64)
    intermediate: int = Field(512, ge=8, le=16384)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    max_length: int = Field(128, ge=8, le=4096, description="Tokens per input (the papers clip at 200).")
    vocab_size: int = Field(8000, ge=100, le=200000, description="WordPiece vocabulary trained per party.")
    checkpoint: str | None = Field(None, description="kind=checkpoint: a local Hugging Face model directory.")

    @model_validator(mode="after")
    def _shape(self) -> "TextModelParams":
        if self.kind == "checkpoint" and not self.checkpoint:
            raise ValueError("kind 'checkpoint' needs checkpoint: <a local Hugging Face model directory>")
        if self.kind != "checkpoint" and self.checkpoint:
            raise ValueError(f"checkpoint is only read with kind 'checkpoint' (kind is {self.kind!r})")
        if self.kind != "checkpoint" and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        return self


class TextTrainingParams(Strict):
    """Supervised training of a teacher or the global model: cross-entropy, AdamW, early stopping."""

    epochs: int = Field(5, ge=1, le=1000)
    batch_size: int = Field(32, ge=1, le=4096)
    lr: float = Field(5e-4, gt=0.0, le=1.0)
    weight_decay: float = Field(0.01, ge=0.0, le=1.0)
    patience: int = Field(2, ge=1, le=1000, description="Epochs without a better validation macro-F1 before stopping.")


class TrainTeachersParams(Strict):
    """Stage ``train_teachers``: one teacher per local client plus the global model, per task."""

    models_dir: str = "models/text"
    messages_dir: str = "data/text_messages"
    out_dir: str = "reports/teachers"
    tasks: list[TextTask] = Field(["sa", "erc", "nli"], min_length=1)
    model: TextModelParams = TextModelParams()
    party_models: dict[str, TextModelParams] = Field(
        {}, description="'<task>.<party>' → model for that party (teachers may differ in architecture).")
    training: TextTrainingParams = TextTrainingParams()
    predict_batch_size: int = Field(128, ge=1)


class EstimateBiasParams(Strict):
    """Stage ``estimate_bias``: B_k from random texts drawn from each teacher's vocabulary (KNOT app. D.1)."""

    out_dir: str = "reports/bias"
    n_texts: int = Field(2000, ge=10, le=10_000_000, description="Random texts per teacher (the papers: 100,000).")
    text_length: int = Field(200, ge=1, le=10_000, description="Vocabulary entries per random text (papers: 200).")
    batch_size: int = Field(256, ge=1)


Weighting = Literal["A", "D", "U", "E"]


class DistillParams(Strict):
    """Stage ``distill``: the eq. 3 student for {Sinkhorn, Entropy} × {A, D, U, E} (+ one-hot ablation)."""

    out_dir: str = "reports/distill"
    losses: list[Literal["sinkhorn", "kl"]] = Field(["sinkhorn", "kl"], min_length=1)
    weightings: list[Weighting] = Field(["A", "D", "U", "E"], min_length=1)
    eps: float = Field(0.01, gt=0.0, le=100.0, description="Entropic regularisation ε of T_ε (cost units).")
    sinkhorn_iterations: int = Field(300, ge=1, le=100000)
    one_hot_ablation: bool = Field(True, description="Also Sinkhorn-E with one-hot label coordinates (app. C.1).")
    learning_without_forgetting: bool = Field(True, description="The frozen global model is one more teacher.")
    epochs: int = Field(3, ge=1, le=1000)
    batch_size: int = Field(32, ge=1, le=4096)
    lr: float = Field(2e-4, gt=0.0, le=1.0)
    weight_decay: float = Field(0.01, ge=0.0, le=1.0)
    eval_batch_size: int = Field(128, ge=1)

    @field_validator("losses", "weightings")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"entries must be distinct (got {v})")
        return v


# ----------------------------------------------------------------------------------------- top level
class Params(Strict):
    """The whole params.yaml. Groups of later stages (text track, valuation) are added by their issues."""

    run: RunParams = RunParams()
    partition: PartitionParams
    fed_distance: FedDistanceParams
    barycenter_valuation: BarycenterValuationParams | None = None
    noisy_removal: NoisyRemovalParams | None = None
    train_teachers: TrainTeachersParams | None = None
    estimate_bias: EstimateBiasParams | None = None
    distill: DistillParams | None = None

    @model_validator(mode="after")
    def _references(self) -> "Params":
        known = self.partition.federations
        self._valuation_references(known)
        self._text_references()
        ref = self.fed_distance.otdd.federation
        if ref not in known:
            raise ValueError(f"fed_distance.otdd.federation: unknown federation {ref!r}; defined: {sorted(known)}")
        if known[ref].scheme != "by_dataset":
            raise ValueError(f"fed_distance.otdd.federation: {ref!r} must have scheme 'by_dataset'")
        for name in self.fed_distance.clustering.federations:
            if name not in known:
                raise ValueError(
                    f"fed_distance.clustering.federations: unknown federation {name!r}; defined: {sorted(known)}"
                )
        return self

    def _text_references(self) -> None:
        """Text stages need the text partitions of every task they name; per-party models name real parties."""
        if self.train_teachers is None and self.distill is None and self.estimate_bias is None:
            return
        text = self.partition.text
        if text is None:
            raise ValueError("partition.text: required by the text-track stages (train_teachers, estimate_bias, "
                             "distill)")
        if self.train_teachers is None:
            raise ValueError("train_teachers: required by estimate_bias and distill")
        for i, task in enumerate(self.train_teachers.tasks):
            if task not in text.tasks:
                raise ValueError(f"train_teachers.tasks[{i}]: task {task!r} has no partition.text.tasks entry; "
                                 f"defined: {sorted(text.tasks)}")
        for key in self.train_teachers.party_models:
            task, _, party = key.partition(".")
            spec = text.tasks.get(task)  # type: ignore[call-overload]
            parties = [] if spec is None else [*spec.locals, spec.global_party]
            if party not in parties:
                allowed = [f"{t}.{p}" for t, s in text.tasks.items() for p in [*s.locals, s.global_party]]
                raise ValueError(f"train_teachers.party_models: unknown party {key!r}; allowed: {', '.join(allowed)}")

    def _valuation_references(self, known: dict[str, Any]) -> None:
        """Federations named by the valuation stages exist, have no held-out gap and enough test rows."""
        refs: list[tuple[str, str, int | None]] = []
        bv, nr = self.barycenter_valuation, self.noisy_removal
        if bv is not None:
            c = bv.contributions
            refs += [(f"barycenter_valuation.contributions.federations[{i}]", n, c.validation_samples)
                     for i, n in enumerate(c.federations)]
            refs.append(("barycenter_valuation.contributions.outlier.federation", c.outlier.federation,
                         c.validation_samples))
            refs.append(("barycenter_valuation.detection.federation", bv.detection.federation,
                         bv.detection.validation_samples))
        if nr is not None:
            refs += [(f"noisy_removal.federations[{i}]", n, nr.validation_samples)
                     for i, n in enumerate(nr.federations)]
        for path, name, n_val in refs:
            if name not in known:
                raise ValueError(f"{path}: unknown federation {name!r}; defined: {sorted(known)}")
            spec = known[name]
            if spec.scheme == "by_dataset":
                raise ValueError(f"{path}: {name!r} has scheme 'by_dataset' (no server test split)")
            if n_val is not None and n_val >= spec.test_samples:
                raise ValueError(f"{path}: validation_samples ({n_val}) must be smaller than "
                                 f"partition.federations.{name}.test_samples ({spec.test_samples})")
        if bv is not None:
            o = bv.contributions.outlier
            spec = known[o.federation]
            if o.client >= getattr(spec, "n_clients", 0):
                raise ValueError(f"barycenter_valuation.contributions.outlier.client: {o.client} ≥ n_clients of "
                                 f"{o.federation!r}")
            if getattr(spec, "scheme", None) == "fedbary_case" and spec.case in (4, 5):
                raise ValueError(f"barycenter_valuation.contributions.outlier.federation: {o.federation!r} is already "
                                 f"noisy (case {spec.case}); use a clean federation")


_TYPE_TAGS = {"str", "int", "float", "bool", "literal['random']", "list[int]"}


def _format_error(err: dict[str, Any], data: Any) -> str:
    loc = [str(x) for x in err["loc"]]
    # discriminated unions put the tag in the path ("partition.federations.x.class_pairs.structure"): drop it
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
        elif (isinstance(node, dict) and node.get("scheme") == part) or part in _TYPE_TAGS:
            continue  # a union branch name, not a key the user wrote
        else:
            parts.append(part)  # the unknown or missing key itself
    path = ".".join(parts).replace(".[", "[")
    msg = err["msg"]
    if loc and loc[-1] == "[key]":
        msg = f"invalid key: {msg}"
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "missing":
        msg = "required key is missing"
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    got = err.get("input")
    if err["type"] not in {"missing", "extra_forbidden"} and not isinstance(got, (dict, list)) and "(got" not in msg:
        msg += f" (got {got!r})"
    return f"{path}: {msg}" if path else msg


def _allowed_keys(model: type[BaseModel]) -> list[str]:
    return sorted(model.model_fields)


def validate_params(data: Any, source: str = "params.yaml") -> Params:
    """Validate a parsed params mapping; raise ConfigError with one line per problem (key path + allowed)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping of stage groups, got {type(data).__name__}")
    try:
        return Params.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            line = _format_error(err, data)
            if err["type"] == "extra_forbidden":
                line += f"; allowed keys here: {', '.join(_allowed_at(err['loc']))}"
            lines.append(f"{source}: {line}")
        # union branches can repeat the same complaint; keep order, drop duplicates
        raise ConfigError("\n".join(dict.fromkeys(lines))) from None


def _allowed_at(loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed in the mapping that contains the (unknown) key at ``loc``."""
    model: Any = Params
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if part in {"by_dataset", "iid", "dirichlet", "class_pairs", "fedbary_case"}:
            model = {
                "by_dataset": ByDatasetFederation, "iid": IidFederation, "dirichlet": DirichletFederation,
                "class_pairs": ClassPairsFederation, "fedbary_case": FedBaryCaseFederation,
            }[part]
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            continue  # a dict key chosen by the user (federation name)
        ann = field.annotation
        # optional groups (``X | None``): look inside the union for the model
        candidates = [ann, *getattr(ann, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), model)
    return _allowed_keys(model) if isinstance(model, type) and issubclass(model, BaseModel) else []


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate params.yaml (stage groups; see the comments in the file)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found (run from the repository root)")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}".replace("\n", " ")) from None
    return validate_params(data, source=str(path))


def groups(params: Params, *names: str) -> dict[str, Any]:
    """The named params groups as plain JSON-able dicts (what a stage reads, logs and hashes)."""
    return {name: getattr(params, name).model_dump(mode="json") for name in names}


def params_hash(section: BaseModel | dict[str, Any]) -> str:
    """A short, stable hash of a params group (tagged on every MLflow run)."""
    payload = section.model_dump(mode="json") if isinstance(section, BaseModel) else section
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def flatten(section: BaseModel | dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten a params group to dotted keys (MLflow params, the compare view lines them up)."""
    data = section.model_dump(mode="json") if isinstance(section, BaseModel) else section
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, prefix=f"{name}."))
        else:
            out[name] = json.dumps(value) if isinstance(value, list) else str(value)
    return out
