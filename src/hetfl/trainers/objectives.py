"""The local loss of every recipe kind (``recipes``), in a registry: kind -> builder of a functional objective.

An objective is ``objective(forward, params, x, y, carry, present=None) -> (loss, carry)``: ``forward(x)`` runs
the sub-model with ``params`` (``torch.func.functional_call``), so the method may run it several
times (SHeteroFL's smaller widths) or act between blocks (ReeFL); ``carry`` is state that lives
across a client's steps as a tensor (ReeFL's running CE per exit; None before the first step), so
the same objective runs one client at a time or stacked under ``torch.func.vmap``. With label masking
(``TrainOptions.label_mask``) ``present`` is the client's classes (``losses.label_masked``): the trainer's
``forward`` already masks its logits, and an objective that runs another module (a narrower width) masks
that module's logits with it. A recipe that trains one of
several sub-networks per step (FjORD's sampled width) has one objective per variant (``step_objectives``); the
step's variant is drawn up front with its batch (``schedule.Step.variant``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.func import functional_call

from ..losses import (best_exit_kd, distilled_ce, exits_ce, label_masked, mutual_kd, per_exit_ce, running_ce,
                      weighted_exits_with_last_teacher)
from ..models.cache import ModelCache
from ..recipes import BestExit, ExitsCE, LastTeacher, OrderedDropout, Recipe, Slimmable, step_variants
from ..slicing import narrowed

Forward = Callable[[torch.Tensor], list[torch.Tensor]]
Objective = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]  # (forward, params, x, y, carry, present=None)
OBJECTIVES: dict[type, Callable[[Recipe, ModelCache], Objective]] = {}


def objective_for(recipe: Recipe, models: ModelCache, variant: int | None = None) -> Objective:
    """The objective ``recipe`` names (``models``: the sub-models it may run besides the trained one); ``variant``:
    the sub-network a step trains where the recipe draws one per step (``recipes.step_variants``; None: its own)."""
    builder = OBJECTIVES[type(recipe)]
    return builder(recipe, models) if variant is None else builder(recipe, models, variant)


def step_objectives(recipe: Recipe, models: ModelCache) -> list[Objective]:
    """The objective of every step variant of ``recipe``, indexed by ``Step.variant`` (one for most recipes)."""
    variants = step_variants(recipe)
    return [objective_for(recipe, models)] if variants == 1 else [objective_for(recipe, models, v)
                                                                   for v in range(variants)]


def registered(kind: type):
    """Registers the decorated builder as the objective of recipe type ``kind``."""
    def register(builder):
        OBJECTIVES[kind] = builder
        return builder
    return register


@registered(ExitsCE)
def _exits_ce(recipe: ExitsCE, models: ModelCache) -> Objective:
    """DepthFL Eq. (1): CE over the exits + kd x mutual KD among them."""
    kd = recipe.kd_weight

    def objective(forward, params, x, y, carry, present=None):
        logits = forward(x)
        return (exits_ce(logits, y) + kd * mutual_kd(logits) if kd else exits_ce(logits, y)), carry

    return objective


@registered(LastTeacher)
def _last_teacher(recipe: LastTeacher, models: ModelCache) -> Objective:
    """ScaleFL Eq. (5)."""
    def objective(forward, params, x, y, carry, present=None):
        return weighted_exits_with_last_teacher(forward(x), y, recipe.beta, recipe.tau, recipe.normaliser), carry

    return objective


@registered(Slimmable)
def _slimmable(recipe: Slimmable, models: ModelCache) -> Objective:
    """SHeteroFL: every smaller width on the leading slices of the same parameters (frozen ones are the module's)."""
    smaller = [(sub, models.module(sub).train(), models.shapes(sub)) for sub in recipe.smaller]  # outside transforms

    def objective(forward, params, x, y, carry, present=None):
        total = exits_ce(forward(x), y)
        for sub, module, shapes in smaller:
            sliced = narrowed(params, shapes, sub)  # leading slices (of every chunk, in dense layers)
            total = total + exits_ce(label_masked(functional_call(module, sliced, (x,)), present), y)
        return total, carry

    return objective


@registered(BestExit)
def _best_exit(recipe: BestExit, models: ModelCache) -> Objective:
    """ReeFL Eq. (5)-(6): the teacher is the exit of lowest running CE on this client, a tensor index (no sync)."""
    def objective(forward, params, x, y, carry, present=None):
        logits = forward(x)
        ce = per_exit_ce(logits, y)
        carry = running_ce(carry, ce, recipe.ema)
        if not recipe.kd_weight or len(logits) < 2:
            return ce.sum(), carry
        return ce.sum() + recipe.kd_weight * best_exit_kd(logits, torch.argmin(carry), recipe.tau), carry

    return objective


@registered(OrderedDropout)
def _ordered_dropout(recipe: OrderedDropout, models: ModelCache, variant: int | None = None) -> Objective:
    """FjORD: the CE of the step's width, the own one or a smaller one run on the leading slices of the own
    parameters (so its gradient lands on the shared leading units); with ``kd``, the own width's CE plus the
    step's width's distilled CE, taught by the own width's detached outputs (``losses.distilled_ce``)."""
    own = len(recipe.smaller)
    variant = own if variant is None else variant
    if not 0 <= variant <= own:
        raise ValueError(f"variant {variant} is not a width of this recipe; one of 0..{own}")
    sub = None if variant == own else recipe.smaller[variant]
    module, shapes = (None, None) if sub is None else (models.module(sub).train(), models.shapes(sub))

    def run(forward, params, x, present):
        """The logits of the step's width."""
        if sub is None:
            return forward(x)
        sliced = narrowed(params, shapes, sub)  # leading slices (of every chunk, in dense layers)
        return label_masked(functional_call(module, sliced, (x,)), present)

    def objective(forward, params, x, y, carry, present=None):
        if not recipe.kd:
            return exits_ce(run(forward, params, x, present), y), carry
        teacher = forward(x)
        if sub is None:  # the own width drawn: its own teacher (KL 0), so CE + (1 - alpha) CE
            return (2 - recipe.alpha) * exits_ce(teacher, y), carry
        kd = sum(distilled_ce(s, t, y, recipe.alpha, recipe.tau)
                 for s, t in zip(run(forward, params, x, present), teacher))
        return exits_ce(teacher, y) + kd, carry

    return objective
