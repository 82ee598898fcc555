"""Helpers the tests share to compare a run's weights bit for bit."""

from pathlib import Path

import torch


def weights(run_dir: Path) -> dict:
    """The final weights a run folder holds."""
    return torch.load(Path(run_dir) / "final_model.pt", weights_only=True)


def assert_identical(a: dict, b: dict) -> None:
    """Same tensor names, every tensor bit-identical."""
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
