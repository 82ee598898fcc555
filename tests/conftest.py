"""Shared fixtures: small, fast configurations on real data (scikit-learn's 8x8 digits)."""

import pytest

from hetfl.methods import config_from


@pytest.fixture
def tiny_cfg(tmp_path):
    """A few-second experiment: digits, quarter-width CNN, 20 clients, 5 per round (a method's defaults apply)."""

    def make(**changes):
        base = dict(dataset="digits", model_width=0.25, num_clients=20, client_fraction=0.25, rounds=3,
                    batch_size=16, lr=0.05, out=str(tmp_path / "runs"), checkpoint_every=1)
        return config_from({**base, **changes})  # the method's defaults apply to options not given

    return make
