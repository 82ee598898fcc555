"""Batched data augmentation (random crop with zero padding, horizontal flip) without torchvision.

Random numbers are drawn on the CPU from the caller's generator, so the result depends only on the
generator's state, whatever device ``x`` lives on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .errors import HetflError


def augment(x: torch.Tensor, generator: torch.Generator, crop_padding: int = 0, flip: bool = False) -> torch.Tensor:
    """``x`` (N, C, H, W) randomly cropped after zero padding by ``crop_padding`` and/or flipped left-right."""
    if crop_padding < 0:
        raise HetflError(f"crop_padding must be >= 0, got {crop_padding}")
    if crop_padding:
        x = random_crop(x, generator, crop_padding)
    if flip:
        x = random_flip(x, generator)
    return x


def random_crop(x: torch.Tensor, generator: torch.Generator, padding: int) -> torch.Tensor:
    """Each image of ``x`` replaced by a random HxW window of itself zero-padded by ``padding`` on every side."""
    n, c, h, w = x.shape
    padded = F.pad(x, (padding, padding, padding, padding))
    top, left = torch.randint(0, 2 * padding + 1, (2, n, 1), generator=generator).to(x.device)
    rows = (top + torch.arange(h, device=x.device))[:, None, :, None]  # (N, 1, H, 1)
    cols = (left + torch.arange(w, device=x.device))[:, None, None, :]  # (N, 1, 1, W)
    samples = torch.arange(n, device=x.device)[:, None, None, None]
    channels = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[samples, channels, rows, cols]  # the four indices broadcast to (N, C, H, W)


def random_flip(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``x`` with each image mirrored left-right with probability 1/2."""
    mask = torch.rand(len(x), generator=generator) < 0.5
    return torch.where(mask.to(x.device)[:, None, None, None], x.flip(-1), x)
