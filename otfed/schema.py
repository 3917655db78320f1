"""The base of every configuration type in otfed: strict pydantic models.

The library's config types (``FedWaDConfig``, ``FedBaryConfig``, ``FedAvgConfig``, ``ModelSpec``,
``TrainingConfig``, ``TextTaskSpec``, the federation specs …) are the types ``params.yaml`` validates into —
one type per concept, one set of defaults. Unknown keys are errors (a typo fails loudly), and building one
directly with a bad value raises :class:`~otfed.errors.ConfigError` naming the field and what is allowed.

Types are strict (pydantic strict mode): ``true`` or ``"3"`` where an int is expected, ``true`` or ``"0.5"``
where a number is expected, ``1`` where a bool is expected are errors, not coerced. An int is still a valid
float, mappings still validate into nested configs, and a field typed as a tuple that YAML writes as a list
says ``Field(strict=False)``.

The library's entry points that take a config (``federated_wasserstein``, ``federated_otdd``,
``federated_valuation`` …) also take a plain mapping of its fields, validated the same way (:func:`as_config`).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping, TypeVar, Union

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic._internal._model_construction import ModelMetaclass  # the metaclass of every pydantic model

from otfed.errors import ConfigError

PositiveInt = Annotated[int, Field(ge=1)]  # list items: errors name the index, e.g. toy.dims[1]


def _interpolation_time(v: Any) -> Any:
    if isinstance(v, float) and not 0.0 < v < 1.0:
        raise ValueError(f"must be 'random' or a number in (0, 1) (got {v})")
    return v


# FedWaD's interpolation time: "random" (t ~ U(0, 1) at every interpolation) or a fixed t in (0, 1);
# None is accepted from Python callers as "random".
InterpolationTime = Annotated[Union[Literal["random"], float],
                              BeforeValidator(lambda v: "random" if v is None else v),
                              AfterValidator(_interpolation_time)]


def plain_message(err: Mapping[str, Any]) -> str:
    """pydantic's message for one error, made plain: ``unknown key`` for a forbidden extra key, and a
    validator's own message without pydantic's ``Value error, `` prefix."""
    if err["type"] == "extra_forbidden":
        return "unknown key"
    msg = err["msg"]
    return msg[len("Value error, "):] if msg.startswith("Value error, ") else msg


def error_lines(exc: ValidationError) -> list[str]:
    """One ``key.path: message`` line per pydantic error (:func:`plain_message`)."""
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"])
        lines.append(f"{path}: {plain_message(err)}" if path else plain_message(err))
    return lines


class _RaisesConfigError(ModelMetaclass):
    """Direct construction (``FedWaDConfig(t=2.0)``) raises ConfigError; validation nested inside another
    model (a whole params file) still reports pydantic's errors with their full key paths."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except ValidationError as exc:
            raise ConfigError("\n".join(f"{cls.__name__}: {line}" for line in error_lines(exc))) from None


class Strict(BaseModel, metaclass=_RaisesConfigError):
    """Base for every config type: unknown keys are errors, no type coercion (strict mode), values are
    validated on assignment.

    Direct construction with bad values raises ConfigError (one line per problem); validation of a whole
    params file goes through ``model_validate`` and is formatted by the stage layer.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)


C = TypeVar("C", bound=Strict)


def as_config(value: Any, cls: type[C], name: str = "config") -> C:
    """``value`` as a ``cls``: an instance of ``cls`` (or of a subclass) unchanged, a mapping validated into one
    (``cls.model_validate``): unknown keys and bad values raise :class:`~otfed.errors.ConfigError` with one
    ``name (cls): key: message`` line per problem (an unknown key also lists the allowed ones) and the key paths
    at fault in ``keys``. Anything else is a TypeError naming the parameter ``name``, the type expected and the
    type got.

    >>> class Example(Strict):
    ...     size: int = 10
    >>> as_config({"size": 3}, Example).size
    3
    >>> as_config({"sise": 3}, Example)
    Traceback (most recent call last):
    ...
    otfed.errors.ConfigError: config (Example): sise: unknown key; allowed keys: size
    >>> as_config(3, Example, "settings")
    Traceback (most recent call last):
    ...
    TypeError: settings must be a Example or a mapping of its fields, got int
    """
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a {cls.__name__} or a mapping of its fields, got {type(value).__name__}")
    try:
        return cls.model_validate(dict(value))
    except ValidationError as exc:
        lines, keys = [], []
        for err in exc.errors():
            path = ".".join(str(p) for p in err["loc"])
            msg = plain_message(err)
            if err["type"] == "extra_forbidden" and len(err["loc"]) == 1:
                msg += f"; allowed keys: {', '.join(sorted(cls.model_fields))}"
            lines.append(f"{name} ({cls.__name__}): {path}: {msg}" if path else f"{name} ({cls.__name__}): {msg}")
            if path:
                keys.append(path)
        raise ConfigError("\n".join(lines), keys=tuple(keys)) from None
