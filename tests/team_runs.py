"""Tiny experiments run as one rank of a team: ``python tests/team_runs.py OUT NAME...``.

tests/test_distributed.py starts it as one process (a team of one) and as several (the launcher's
environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), then compares the runs' final weights.
ReeFL trains the tiny BERT of ``tinybert`` (HETFL_MINILM_DIR) on seeded word-per-class documents.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from tinybert import WORDS  # noqa: E402

from hetfl.methods import config_from  # noqa: E402

TEXT_LENGTH = 8


def configs(out: str) -> dict:
    """name -> config of each experiment (digits, quarter-width CNNs; ReeFL on the tiny BERT)."""
    tiny = dict(dataset="digits", model_width=0.25, num_clients=12, client_fraction=0.5, rounds=2, batch_size=16,
                lr=0.05, checkpoint_every=1, out=out)
    return {
        "alllarge": dict(tiny, method="alllarge"),
        "heterofl": dict(tiny, method="heterofl"),
        "depthfl": dict(tiny, method="depthfl"),  # FedDyn: each client's own state travels to the rank training it
        "fedepth": dict(tiny, method="fedepth", model="preresnet20", batch_size=8),
        "scalefl": dict(tiny, method="scalefl", client_test_fraction=0.2),  # local accuracy is shared too
        "reefl": dict(method="reefl", dataset="r8", max_length=TEXT_LENGTH, finetune="lora", adapter_rank=4,
                      num_clients=6, client_fraction=1.0, levels=2, rounds=2, batch_size=8, lr=0.3, out=out),
    }


def install_text_data() -> None:
    """Returns None; makes "r8" read seeded documents whose every word names the class (tests/test_reefl.py)."""
    import os

    from hetfl.data import datasets

    tokenizer = (Path(os.environ["HETFL_MINILM_DIR"]) / "tokenizer.json").resolve()
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (120,), generator=g)
    x = torch.randint(5, 5 + len(WORDS), (120, TEXT_LENGTH), generator=g)
    x[:, 0], x[:, 1:] = 2, 5 + y[:, None]
    datasets._LOADED[("r8:8", f"|{tokenizer}")] = datasets.Dataset("r8", x, y, x[:60], y[:60], 3)


def main(out: str, names: list[str]) -> None:
    from hetfl import distributed
    from hetfl.sim import Simulation

    if "reefl" in names:
        install_text_data()
    team = distributed.join(10.0)
    every = configs(out)
    for name in names:
        Simulation(config_from({**every[name], "name": name}), team=team).run(progress=False)
    team.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
