"""Griffe extension for the API reference: every config type's fields, defaults and allowed values, as a table.

otfed's config types are pydantic models (:class:`otfed.schema.Strict`). Their fields are declared as
``support_size: int = Field(10, ge=1, le=20000, description=…)``, which carries no attribute docstring, so
mkdocstrings shows none of them: a reader of the API page could not see that ``support_size`` or ``init_scale``
exist, let alone their defaults. This extension imports each documented class; where it is a pydantic model it
appends a **Fields** table to the class's docstring, built from the model's own ``model_fields`` — every field
(inherited ones included), its type, its default, what it allows (the ``ge`` / ``gt`` / ``le`` / ``lt`` bounds,
a ``Literal``'s values, ``None``) and its ``description``. The table is what pydantic validates, so it cannot drift
from the code.

Loaded by ``mkdocs.yml`` (``plugins.mkdocstrings.handlers.python.options.extensions``), before
``griffe_rst.py:RstToMarkdown`` so that roles and maths in the descriptions are converted like the rest of the
docstring. ``tests/test_docs_api.py`` builds the API pages and checks every config's fields there.
"""
from __future__ import annotations

import importlib
import types
import typing
from typing import Any

import annotated_types
import griffe
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

HEADER = ["field", "type", "default", "allowed", "description"]


class ConfigFields(griffe.Extension):
    """Append a Fields table to the docstring of every pydantic model the API reference documents."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if not isinstance(obj, griffe.Class):
            return
        model = runtime_model(obj.module.path, obj.name)
        if model is None:
            return
        table = "\n".join(fields_table(model))
        if obj.docstring is None:
            obj.docstring = griffe.Docstring(table, parent=obj)
        else:
            obj.docstring.value = obj.docstring.value.rstrip() + "\n\n" + table


def runtime_model(module: str, name: str) -> type[BaseModel] | None:
    """The pydantic model class ``module.name`` defines, or None (not importable, not a model, or imported there
    from elsewhere: it is documented where it is defined)."""
    try:
        value = getattr(importlib.import_module(module), name, None)
    except Exception:  # noqa: BLE001 — a module that does not import is documented statically, without a table
        return None
    if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == module:
        return value
    return None


def fields_table(model: type[BaseModel]) -> list[str]:
    """The Markdown lines of ``model``'s Fields table (a bold heading, then one row per field, in order)."""
    rows = [[f"`{name}`", type_text(info.annotation), default_text(info), allowed_text(info),
             description_text(model, name, info)]
            for name, info in model.model_fields.items()]
    return ["**Fields** (name, type, default, allowed values; unknown keys are errors)", "",
            _row(HEADER), _row(["---"] * len(HEADER)), *map(_row, rows)]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"


def type_text(annotation: Any) -> str:
    """A type as a reader writes it: ``int``, ``float | None``, ``Literal['auto', 'exact']``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return type_text(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return "Literal[" + ", ".join(repr(a) for a in typing.get_args(annotation)) + "]"
    if annotation is type(None):
        return "None"
    if origin is not None:
        args = ", ".join(type_text(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def default_text(info: Any) -> str:
    """The default as code (``repr``), ``required`` where there is none, the factory's value where one makes it."""
    if info.default is not PydanticUndefined:
        return f"`{info.default!r}`"
    if info.default_factory is not None:
        try:
            return f"`{info.default_factory()!r}`"
        except TypeError:  # a factory that takes the validated data
            return "computed"
    return "required"


BOUNDS = ((annotated_types.Ge, "ge", "≥"), (annotated_types.Gt, "gt", ">"), (annotated_types.Le, "le", "≤"),
          (annotated_types.Lt, "lt", "<"), (annotated_types.MinLen, "min_length", "length ≥"),
          (annotated_types.MaxLen, "max_length", "length ≤"), (annotated_types.MultipleOf, "multiple_of",
                                                                "a multiple of"))


def allowed_text(info: Any) -> str:
    """What validation accepts: the bounds (``≥ 1, ≤ 20000``), a Literal's values, ``None`` where it is allowed."""
    parts = []
    for constraint in info.metadata:
        for kind, attribute, symbol in BOUNDS:
            if isinstance(constraint, kind):
                parts.append(f"{symbol} {getattr(constraint, attribute)!r}")
    literals = _literal_values(info.annotation)
    if literals:
        parts.append("one of " + ", ".join(f"`{v!r}`" for v in literals))
        others = [type_text(a) for a in _union_members(info.annotation)
                  if typing.get_origin(a) is not typing.Literal and a is not type(None)]
        if others:
            parts.append("or a " + " or ".join(others) + " (see the description)")
    if _allows_none(info.annotation) and not any(v is None for v in literals):
        parts.append("or `None`")
    return ", ".join(parts)


def _union_members(annotation: Any) -> tuple[Any, ...]:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _union_members(typing.get_args(annotation)[0])
    return typing.get_args(annotation) if origin in (typing.Union, types.UnionType) else (annotation,)


def _literal_values(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return list(typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        args = typing.get_args(annotation)
        return [v for a in (args[:1] if origin is typing.Annotated else args) for v in _literal_values(a)]
    return []


def _allows_none(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _allows_none(typing.get_args(annotation)[0])
    return origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(annotation)


def description_text(model: type[BaseModel], name: str, info: Any) -> str:
    """The field's ``description``; for an inherited field, the class it comes from."""
    text = info.description or ""
    owner = next((base for base in model.__mro__[1:] if isinstance(base, type) and issubclass(base, BaseModel)
                  and name in getattr(base, "model_fields", {})), None)
    if owner is not None and owner is not BaseModel and name not in model.__dict__.get("__annotations__", {}):
        text = (text + " " if text else "") + f"(from :class:`{owner.__module__}.{owner.__name__}`)"
    return text
