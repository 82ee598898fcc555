"""Options as typed dataclass fields: help text, allowed values, and conversion of flag/TOML values.

Shared by the generic ``Config`` and by every method's own options (``methods.*.Options``), so
that both reach the CLI and TOML files the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any

from .errors import HetflError


def opt(default: Any, help: str, choices: tuple | None = None, added_later: bool = False):
    """An option field with its help text and, for enumerations, the allowed values.

    ``added_later``: the option came after run folders, checkpoints and bench folder names had
    recorded resolved configs; it is recorded only when it differs from its default
    (``recorded``), so that an earlier run's config stays what it was (absent = the default).
    """
    kwargs = {"default_factory": lambda: list(default)} if isinstance(default, list) else {"default": default}
    return field(metadata={"help": help, "choices": choices, "added_later": added_later}, **kwargs)


def recorded(values: dict[str, Any], cls) -> dict[str, Any]:
    """``values`` of ``cls``'s options without those added later and left at their defaults."""
    fields = option_fields(cls)
    return {k: v for k, v in values.items()
            if not (k in fields and fields[k].metadata.get("added_later") and v == default_of(fields[k]))}


def option_fields(cls) -> dict[str, dataclasses.Field]:
    """The option fields of a dataclass, by name."""
    return {f.name: f for f in dataclasses.fields(cls)}


def default_of(f: dataclasses.Field) -> Any:
    """A field's default value."""
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def check_choices(obj) -> None:
    """Raise HetflError naming the first field of ``obj`` whose value is not among its choices."""
    for f in dataclasses.fields(obj):
        choices = f.metadata.get("choices")
        value = getattr(obj, f.name)
        if choices and value not in choices:
            raise HetflError(f"{f.name} '{value}' is not allowed; choose one of: {', '.join(choices)}")


def coerce(key: str, value: Any, annotation: Any, source: str) -> Any:
    """``value`` converted to the field's type; a one-line error naming the field if it cannot be."""
    kind = annotation.__name__ if isinstance(annotation, type) else str(annotation)  # "int", "list[float]", ...
    try:
        if kind.startswith("list"):
            items = value.split(",") if isinstance(value, str) else list(value)
            item_type = float if "float" in kind else int
            return [item_type(x) for x in items if str(x).strip() != ""]
        if kind == "bool":
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            return bool(value)
        if kind == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if kind == "float":
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise HetflError(f"{source}: {key} must be of type {kind}, got {value!r}") from None
