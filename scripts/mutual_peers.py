"""How good a teacher is each m-FeDepth client's kept peer model? Accuracy and class spread on the test set.

    python scripts/mutual_peers.py RUN_DIR [--peers 6]

Loads a finished m-FeDepth run's global model and the peer models its clients keep in their own
state between rounds (``peer1/`` in ``RUN_DIR/client_state/CLIENT.pt``, the model each trains beside
the one it uploads; see ``client._blockwise_update``), evaluates each on the test set with static
BN (as the run did), and prints per peer: its accuracy, its client's main classes (those with at
least 5% of its samples), and the share of test images it assigns to them. A peer that predicts
only its client's classes is a local model: the KL term of deep mutual learning pulls the uploaded
model towards it.

Written for the diagnosis of m-FeDepth under fedepth-table2.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from finished_run import load_finished, test_predictions

PEER = "peer1/"
MAIN_SHARE = 0.05  # a client's main classes: those with at least this share of its samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--peers", type=int, default=6, help="how many peers to evaluate (clients in id order)")
    args = parser.parse_args()

    sim = load_finished(args.run_dir)
    predictions = lambda params: test_predictions(sim, params)  # noqa: E731
    accuracy = lambda pred: (pred == sim.y_test).double().mean().item()  # noqa: E731
    print(f"global model: accuracy {accuracy(predictions(sim.state.params)):.4f}")
    rows = []
    for path in sorted((args.run_dir / "client_state").glob("*.pt"), key=lambda p: int(p.stem)):
        peer = {k[len(PEER):]: v for k, v in torch.load(path).items() if k.startswith(PEER)}
        if not peer:
            continue
        pred, client = predictions(peer), int(path.stem)
        counts = torch.bincount(sim.y_train[sim.parts[client]], minlength=sim.dataset.num_classes)
        own = [c for c, n in enumerate(counts.tolist()) if n >= MAIN_SHARE * counts.sum()]
        own_share = torch.isin(pred, torch.tensor(own)).double().mean().item()
        rows.append((accuracy(pred), own_share))
        print(f"client {client}: peer accuracy {rows[-1][0]:.4f}; its {len(own)} main classes {own} take "
              f"{own_share:.1%} of its predictions")
        if len(rows) == args.peers:
            break
    if rows:
        accs = sorted(a for a, _ in rows)
        print(f"{len(rows)} peers: accuracy min / median / max {accs[0]:.4f} / {statistics.median(accs):.4f} / "
              f"{accs[-1]:.4f}; median share of predictions in the client's main classes "
              f"{statistics.median(s for _, s in rows):.1%}")


if __name__ == "__main__":
    main()
