"""Every profile key with its value, default, unit, SGLang flag and meaning: what
``escha-deploy profiles show NAME --keys`` prints.

The facts come from the profile models themselves (field types, defaults, descriptions, and
each key's ``SGLangFlag`` metadata) and from the SGLang 0.5.19 flag catalog
(``escha_deploy/catalog/``, generated from its real parser): a key's flag is shown only when the
catalog has that flag. Pure: no I/O beyond reading the catalog.
"""

from __future__ import annotations

import typing

from pydantic import BaseModel
from pydantic_core import PydanticUndefined



def _unit(field, is_size: bool, key: str) -> str:
    if is_size:
        return "bytes (write a unit: 12GiB, 30GB)"
    desc = (field.description or "").lower()
    if "gb (1e9)" in desc:
        return "GB (1e9)" + (" per rank" if "per rank" in desc else "")
    ann = field.annotation
    choices = _literal_choices(ann)
    names = _type_names(ann)
    if choices:
        number = " or a number" if names & {"float", "int"} else ""
        many = "a list of " if names & {"list", "tuple"} else "one of " if len(choices) > 1 else ""
        return many + ", ".join(choices) + number
    many = "a list, each " if names & {"list", "tuple"} else ""
    for t, unit in (("bool", "true/false"), ("float", "number"), ("int", "whole number"), ("str", "text")):
        if t in names:
            return many + unit
    return "list" if "list" in str(ann) or "tuple" in str(ann) else "see description"


def _type_names(ann) -> set[str]:
    """Names of the plain types in an annotation (unions and Annotated unwrapped)."""
    if typing.get_origin(ann) is typing.Annotated:
        return _type_names(typing.get_args(ann)[0])
    args = typing.get_args(ann)
    if args and typing.get_origin(ann) is not typing.Literal:
        return set().union(*(_type_names(a) for a in args)) | {getattr(typing.get_origin(ann), "__name__", "")}
    return {getattr(ann, "__name__", str(ann))}


def _literal_choices(ann) -> list[str]:
    if typing.get_origin(ann) is typing.Literal:
        return [str(a) for a in typing.get_args(ann)]
    out: list[str] = []
    for a in typing.get_args(ann):
        out += _literal_choices(a)
    return out


def _text(value) -> str:
    """A value as the rows carry it (``null``, ``true``; an empty string stays empty: the
    table shows it as ``""``, JSON as the empty string it is)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _default(field, is_size: bool) -> str:
    from escha_deploy.utils.units import fmt_size_readable

    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default if field.default_factory is None else field.default_factory()
    if isinstance(value, BaseModel):
        return "(section)"
    if is_size and isinstance(value, int):
        return fmt_size_readable(value)
    return _text(value)


def key_rows(profile: BaseModel) -> list[dict[str, str]]:
    """One row per leaf key of ``profile`` (dotted key): ``key``, ``value``, ``default``,
    ``unit``, ``sglang_flag`` ('' when none) and ``description``."""
    from escha_deploy.sglang.flagcheck import load_catalog
    from escha_deploy.profile import is_size_field, profile_to_data, sglang_flag

    catalog = load_catalog()
    rows: list[dict[str, str]] = []

    def walk(model: BaseModel, data: dict, prefix: str) -> None:
        for name, field in type(model).model_fields.items():
            value = getattr(model, name)
            key = f"{prefix}{name}"
            if isinstance(value, BaseModel):
                walk(value, data.get(name, {}), key + ".")
                continue
            size = is_size_field(field)
            desc = field.description or ""
            meta = sglang_flag(field)
            flags = [meta.flag] if meta is not None and meta.flag in catalog.by_option else []
            shown = data.get(name, value)
            rows.append({"key": key, "value": _text(shown),
                         "default": _default(field, size), "unit": _unit(field, size, key),
                         "sglang_flag": ", ".join(dict.fromkeys(flags)), "description": desc})

    walk(profile, profile_to_data(profile, readable=True), "")
    return rows
