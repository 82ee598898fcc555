"""A client's data and its step schedule: every random number of its local training, drawn up front.

The schedule (batch order, crop offsets, flips; then, for a recipe that trains one of several
sub-networks per step, each step's variant) comes from the client's generator, seeded by
(seed, "train", round, client), in the order the loop used to draw it (each epoch's shuffle, then
each batch's augmentation), so the same client gets the same batches whichever executor trains it
and whether it is trained alone or stacked with others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import augment
from ..task import TrainOptions


@dataclass(frozen=True)
class ClientData:
    """A client's samples: the dataset's tensors (shared, on the device) and this client's indices."""

    x: torch.Tensor
    y: torch.Tensor
    indices: torch.Tensor

    def __len__(self) -> int:
        return len(self.indices)


@dataclass(frozen=True)
class Step:
    """One local step: positions in the client's data (not dataset indices), the batch's augmentation draws, and
    which of its recipe's sub-networks the step trains (``recipes.step_variants``; 0 for most recipes)."""

    batch: torch.Tensor
    draws: augment.Draws
    variant: int = 0


def batches(num_samples: int, batch_size: int, generator: torch.Generator, within: bool = False) -> list[torch.Tensor]:
    """A seeded shuffle of range(num_samples) cut into batches (the last one may be smaller).

    A last batch of one sample joins the one before: batch statistics of a single sample are
    undefined where the features are 1x1 (BatchNorm raises). With ``within``, the last two batches
    are instead split in halves, so that no batch exceeds ``batch_size`` (a memory budget measured
    at the batch size then holds for every step).
    """
    parts = list(torch.randperm(num_samples, generator=generator).split(batch_size))
    if len(parts) > 1 and len(parts[-1]) == 1:
        tail = torch.cat(parts[-2:])
        parts[-2:] = list(tail.split((len(tail) + 1) // 2)) if within else [tail]
    return parts


def draw_schedule(num_samples: int, opts: TrainOptions, generator: torch.Generator,
                  within_batch_size: bool = False) -> list[Step]:
    """Every step of ``opts.epochs`` epochs over ``num_samples`` samples, with its augmentation drawn."""
    steps = []
    for _ in range(opts.epochs):
        for batch in batches(num_samples, opts.batch_size, generator, within_batch_size):
            steps.append(Step(batch, augment.draw(len(batch), generator, opts.crop_padding, opts.flip)))
    return steps


def draw_variants(schedule: list[Step], variants: int, generator: torch.Generator) -> list[Step]:
    """``schedule`` with each step's variant drawn uniformly from range(``variants``), after every batch (so the
    batches are those of a recipe without variants); unchanged, and nothing drawn, for one variant."""
    if variants == 1:
        return schedule
    drawn = torch.randint(variants, (len(schedule),), generator=generator).tolist()
    return [Step(step.batch, step.draws, v) for step, v in zip(schedule, drawn)]


def on_device(schedule: list[Step], device: torch.device) -> list[Step]:
    """``schedule`` with its positions and draws on ``device``, each kind moved in one copy (a copy per step would
    make an accelerator wait for the host at every step)."""
    if not schedule:
        return schedule
    sizes = [len(step.batch) for step in schedule]
    batches = torch.cat([step.batch for step in schedule]).to(device).split(sizes)
    first = schedule[0].draws
    offsets = torch.cat([step.draws.offsets for step in schedule], 1).to(device).split(sizes, 1) \
        if first.offsets is not None else [None] * len(schedule)
    flips = torch.cat([step.draws.flips for step in schedule]).to(device).split(sizes) \
        if first.flips is not None else [None] * len(schedule)
    return [Step(b, augment.Draws(o, f, first.padding), step.variant)
            for b, o, f, step in zip(batches, offsets, flips, schedule)]


def step_inputs(data: ClientData, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
    """The (augmented) samples and labels of ``step``."""
    idx = data.indices[step.batch.to(data.indices.device)]
    return augment.apply(data.x[idx], step.draws), data.y[idx]
