"""Options as typed dataclass fields: help text, allowed values, and conversion of flag/TOML values.

Shared by the generic ``Config`` and by every method's own options (``methods.*.Options``), so
that both reach the CLI and TOML files the same way.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from .errors import HetflError


FLOAT32_MAX = 3.4028234663852886e38  # every float option ends up in a float32 tensor or beside one
INT64_MAX = 2 ** 63 - 1


@dataclass(frozen=True)
class Range:
    """The values a numeric option allows: ``low`` and ``high`` (None: unbounded), each closed unless ``*_open``.

    Floats must also be finite and within float32's range, ints within int64's: the limits of the
    tensors and files every option reaches.
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        """Whether ``value`` is within the bounds."""
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self) -> str:
        """The bounds as a user reads them: "> 0", ">= 1", "in (0, 1]", "in [0, 4294967295]"."""
        low, high = _number(self.low), _number(self.high)
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {low}"
        return f"{'<' if self.high_open else '<='} {high}"

    def edges(self, integer: bool) -> list[str]:
        """Values just outside each bound, as flag text (for tests of the bounds)."""
        out = []
        for bound, is_open, down in ((self.low, self.low_open, True), (self.high, self.high_open, False)):
            if bound is None:
                continue
            if integer:
                out.append(str(int(bound) - 1 if down else int(bound) + 1))
            elif is_open:
                out.append(repr(float(bound)))
            else:
                out.append(repr(math.nextafter(bound, -math.inf if down else math.inf)))
        return out


def _number(x: float | None) -> str:
    """``x`` as written in a range: integers in full, other numbers in their shortest form."""
    return str(int(x)) if x is not None and float(x).is_integer() else f"{x:g}" if x is not None else ""


def check_value(name: str, value: Any, kind: str, valid: Range | None) -> None:
    """Returns None; raises HetflError unless ``value`` (an int, a float or a list of them, by ``kind``) is usable:
    finite floats within float32's range, ints within int64's, and every value within ``valid``."""
    items = value if isinstance(value, list) else [value]
    for item in items:
        if "float" in kind and not (math.isfinite(item) and abs(item) <= FLOAT32_MAX):
            raise HetflError(f"{name} must be a finite number{' ' + valid.describe() if valid else ''} within "
                             f"float32's range, got {item!r}")
        if "int" in kind and not -INT64_MAX - 1 <= item <= INT64_MAX:
            raise HetflError(f"{name} must be a 64-bit integer{' ' + valid.describe() if valid else ''}, got {item}")
        if valid is not None and not valid.holds(item):
            what = "an integer " if "int" in kind and "list" not in kind else ""
            raise HetflError(f"{name} must be {what}{valid.describe()}, got "
                             f"{value if isinstance(value, list) else item}")


def check_ranges(obj) -> None:
    """Returns None; raises HetflError naming the first numeric field of the dataclass ``obj`` that is not usable
    (``check_value``)."""
    for f in dataclasses.fields(obj):
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        if kind in ("int", "float", "list[int]", "list[float]"):
            check_value(f.name, getattr(obj, f.name), kind, f.metadata.get("range"))


def opt(default: Any, help: str, choices: tuple | None = None, added_later: bool = False,
        valid: Range | None = None):
    """An option field with its help text and, for enumerations, the allowed values; for numbers, the range
    ``valid`` they must be in (``check_ranges``).

    ``added_later``: the option came after run folders, checkpoints and bench folder names had
    recorded resolved configs; it is recorded only when it differs from its default
    (``recorded``), so that an earlier run's config stays what it was (absent = the default).
    """
    kwargs = {"default_factory": lambda: list(default)} if isinstance(default, list) else {"default": default}
    return field(metadata={"help": help, "choices": choices, "added_later": added_later, "range": valid}, **kwargs)


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
    """``value`` converted to the field's type; a one-line error naming the field if it cannot be.

    Text converts (a flag's value is text); otherwise the value must already be of the type: a TOML
    ``rounds = true``, ``flip = 5`` or ``lr_steps = [1.7]`` is an error, not 1 round, true, or [1].
    """
    kind = annotation.__name__ if isinstance(annotation, type) else str(annotation)  # "int", "list[float]", ...
    try:
        if kind.startswith("list"):
            if isinstance(value, str):
                items = value.split(",") if value.strip() else []  # "": the empty list
                if any(not x.strip() for x in items):
                    raise ValueError  # "1,,2": an empty item is a typo, not a skipped value
            elif isinstance(value, (list, tuple)):
                items = list(value)
            else:
                raise ValueError
            item = "float" if "float" in kind else "int"
            return [_scalar(x, item) for x in items]
        return _scalar(value, kind)
    except (TypeError, ValueError, OverflowError):
        raise HetflError(f"{source}: {key} must be of type {kind}, got {value!r}") from None


def _scalar(value: Any, kind: str) -> Any:
    """``value`` as a ``kind`` (bool, int, float or str): text is parsed, other types must match (ValueError)."""
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.strip().lower() in ("1", "true", "yes", "on")
        raise ValueError
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError
        return value
    if isinstance(value, bool):  # a bool is an int to Python, never a number to a user
        raise ValueError
    if kind == "int":
        if isinstance(value, str):
            return int(value.strip())
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError
            return int(value)
        if isinstance(value, int):
            return value
        raise ValueError
    if kind == "float":
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            return float(value.strip())
        raise ValueError
    return value
