"""Batched data augmentation (random crop with zero padding, horizontal flip) without torchvision.

Random numbers are drawn on the CPU from the caller's generator (``draw``), separately from their
application (``apply``): a trainer draws a client's whole schedule up front, so the result depends
only on the generator's state, whatever device ``x`` lives on and however clients are batched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .errors import HetflError


@dataclass(frozen=True)
class Draws:
    """The random numbers of one batch's augmentation: crop offsets (2, N, 1) and flip mask (N,), None when off."""

    offsets: torch.Tensor | None = None
    flips: torch.Tensor | None = None
    padding: int = 0


def draw(n: int, generator: torch.Generator, crop_padding: int = 0, flip: bool = False) -> Draws:
    """The random numbers that augmenting ``n`` images takes from ``generator`` (crop first, then flip)."""
    if crop_padding < 0:
        raise HetflError(f"crop_padding must be >= 0, got {crop_padding}")
    offsets = torch.randint(0, 2 * crop_padding + 1, (2, n, 1), generator=generator) if crop_padding else None
    flips = torch.rand(n, generator=generator) < 0.5 if flip else None
    return Draws(offsets, flips, crop_padding)


def apply(x: torch.Tensor, draws: Draws) -> torch.Tensor:
    """``x`` (N, C, H, W) cropped and/or flipped as ``draws`` say (``x`` itself when both are off)."""
    if draws.offsets is not None:
        x = random_crop(x, draws.offsets.to(x.device), draws.padding)
    if draws.flips is not None:
        x = torch.where(draws.flips.to(x.device)[:, None, None, None], x.flip(-1), x)
    return x


def augment(x: torch.Tensor, generator: torch.Generator, crop_padding: int = 0, flip: bool = False) -> torch.Tensor:
    """``x`` (N, C, H, W) randomly cropped after zero padding by ``crop_padding`` and/or flipped left-right."""
    return apply(x, draw(len(x), generator, crop_padding, flip))


def random_crop(x: torch.Tensor, offsets: torch.Tensor, padding: int) -> torch.Tensor:
    """Each image of ``x`` replaced by the HxW window at ``offsets`` (top, left) of itself zero-padded by
    ``padding`` on every side."""
    n, c, h, w = x.shape
    padded = F.pad(x, (padding, padding, padding, padding))
    top, left = offsets
    rows = (top + torch.arange(h, device=x.device))[:, None, :, None]  # (N, 1, H, 1)
    cols = (left + torch.arange(w, device=x.device))[:, None, None, :]  # (N, 1, 1, W)
    samples = torch.arange(n, device=x.device)[:, None, None, None]
    channels = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[samples, channels, rows, cols]  # the four indices broadcast to (N, C, H, W)
