"""The local losses a task can name: one small, frozen recipe type per kind (DESIGN.md, "Data flow").

A recipe is plain data (its kind and its weights at this round); the client turns it into a loss
function through the registry in ``trainers.objectives``. Recipes are hashable, so the batched
executor groups clients whose recipes are equal.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from .slicing import SubModel


@dataclass(frozen=True)
class ExitsCE:
    """Sum of the cross-entropies over the held exits + ``kd_weight`` x DepthFL Eq. (1)'s mutual KD among them."""

    kind: ClassVar[str] = "exits_ce"
    kd_weight: float = 0.0


@dataclass(frozen=True)
class LastTeacher:
    """ScaleFL Eq. (5): exits weighted by depth, KD from the last exit at temperature ``tau`` with weight ``beta``."""

    kind: ClassVar[str] = "last_teacher"
    beta: float = 0.0
    tau: float = 1.0
    normaliser: str = "sum"  # divide by sum_i i ("sum") or by n ("last"); see losses.weighted_exits_with_last_teacher

    def __post_init__(self):
        if self.normaliser not in ("sum", "last"):
            raise ValueError(f"normaliser '{self.normaliser}' is unknown; one of sum, last")


@dataclass(frozen=True)
class Slimmable:
    """SHeteroFL: the CE of the own width + of every width in ``smaller``, on the leading slices of one parameter set."""

    kind: ClassVar[str] = "slimmable"
    smaller: tuple[SubModel, ...] = ()


@dataclass(frozen=True)
class BestExit:
    """ReeFL Eq. (5)-(6): CE over the exits + ``kd_weight`` x KD from the exit of lowest running CE (weight ``ema``
    of a new batch, Sec. 3.2) at temperature ``tau``."""

    kind: ClassVar[str] = "best_exit"
    kd_weight: float = 0.0
    tau: float = 1.0
    ema: float = 0.2


@dataclass(frozen=True)
class OrderedDropout:
    """FjORD (Horvath et al., 2021): each step trains ONE width, drawn up front uniformly from ``smaller`` and the
    client's own (``Step.variant``: an index into ``smaller``, or ``len(smaller)`` for the own width), on the
    leading slices of the own width's parameters. With ``kd``, the own width also takes its CE and teaches the drawn
    one: (1 - ``alpha``) CE + ``alpha`` ``tau``^2 KL (``losses.distilled_ce``)."""

    kind: ClassVar[str] = "ordered_dropout"
    smaller: tuple[SubModel, ...] = ()
    kd: bool = False
    alpha: float = 1.0
    tau: float = 1.0


Recipe = ExitsCE | LastTeacher | Slimmable | BestExit | OrderedDropout
RECIPES: dict[str, type] = {r.kind: r for r in (ExitsCE, LastTeacher, Slimmable, BestExit, OrderedDropout)}
LOSS_KINDS = tuple(RECIPES)


def step_variants(recipe: Recipe) -> int:
    """How many sub-networks a step of ``recipe`` chooses among (``Step.variant``): 1, except FjORD's widths."""
    return len(recipe.smaller) + 1 if isinstance(recipe, OrderedDropout) else 1


def recipe_to_dict(recipe: Recipe) -> dict:
    """``recipe`` as plain values, its kind included."""
    return {"kind": recipe.kind, **asdict(recipe)}


def recipe_from_dict(d: dict) -> Recipe:
    """The recipe ``recipe_to_dict`` wrote; ValueError for an unknown kind."""
    d = dict(d)
    kind = d.pop("kind", None)
    if kind not in RECIPES:
        raise ValueError(f"loss kind '{kind}' is unknown; one of {', '.join(LOSS_KINDS)}")
    if kind in ("slimmable", "ordered_dropout"):
        d["smaller"] = tuple(SubModel.from_dict(s) for s in d.get("smaller", ()))
    return RECIPES[kind](**d)
