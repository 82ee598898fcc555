"""Does an exit of a finished run predict the label mix of the last clients that trained it?

    python scripts/label_skew.py RUN_DIR [--exit 4] [--rounds 3]

Loads the run's final global model, evaluates the exit on the test set (static BN, as the run
did), and prints its recall per class and the share of test images it assigns to each class,
beside the label shares of the clients that trained the exit in each of the last ``--rounds``
rounds (the run's seeded sampling and levels, replayed without training). The last line is the
Pearson correlation between the exit's predicted shares and the label shares of the last round
in which any client trained it: near 0 for an exit that learned the balanced test
distribution, high for one that follows the few clients that trained it last.

Written for DepthFL Tables 4-5 (Dynamic, non-IID: classifier 4/4 far below 3/4); any run of a
depth method on a non-IID partition works.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from finished_run import load_finished, test_predictions


def trains_exit(spec, number: int) -> bool:
    """Whether a client's sub-model (None: it sits out) reaches and holds the 1-based exit ``number``."""
    return spec is not None and spec.depth >= number and (spec.exits is None or number in spec.exits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--exit", type=int, default=4, help="the 1-based exit of the global model")
    parser.add_argument("--rounds", type=int, default=3, help="how many last rounds to list")
    args = parser.parse_args()

    sim = load_finished(args.run_dir)
    cfg = sim.cfg
    pred, y = test_predictions(sim, sim.state.params, args.exit), sim.y_test
    classes = sim.dataset.num_classes
    predicted = torch.bincount(pred, minlength=classes).double() / len(pred)
    print(f"exit {args.exit}: accuracy {(pred == y).double().mean().item():.4f}")
    print("recall per class        ", np.round([(pred[y == c] == c).double().mean().item() for c in range(classes)], 2))
    print("predicted class shares  ", np.round(predicted.numpy(), 3))

    last_shares = None
    for r in range(cfg.rounds - args.rounds, cfg.rounds):  # 0-based round indices
        trained = [c for c in sim.sample_clients(r) if trains_exit(sim.method.plan(c, sim.budget(c, r), r), args.exit)]
        counts = sum((torch.bincount(sim.y_train[sim.parts[c]], minlength=classes) for c in trained),
                     torch.zeros(classes, dtype=torch.long))
        shares = counts.double() / max(int(counts.sum()), 1)
        print(f"round {r + 1}: trained by clients {trained}; their label shares {np.round(shares.numpy(), 2)}")
        if trained:
            last_shares = shares
    if last_shares is not None:
        r = np.corrcoef(predicted.numpy(), last_shares.numpy())[0, 1]
        print(f"correlation of the predicted shares with the last trainers' label shares: {r:.2f}")


if __name__ == "__main__":
    main()
