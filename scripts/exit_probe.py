"""Are a finished run's deepest-exit features worse than the pretrained ones, or is its head behind them?

    python scripts/exit_probe.py RUN_DIR [--train-docs 4000] [--test-docs 3000]

For a run on a pretrained text backbone (MiniLM): the summary the global model's last exit reads
(the token mean after its block), for a seeded subset of the training and test documents, from
the run's final model and from the pretrained model (the run's initial state: LoRA's B and the
adapters start at zero, so its blocks compute the pretrained function). On each, a linear probe
of the exit's form (LayerNorm + Linear, fresh) is trained centrally (full batch, Adam lr 1e-2, 300
steps) and its test accuracy printed beside the run's own head on the same documents. The probes
compare the two feature sets with each other; a probe sees fewer documents than the federation
did, so its accuracy is not comparable with the run's table. Subsets, because computing every
document's summaries takes about an hour of one CPU core per model.

Written for reefl-20ng-depthfl-lora-controls (DepthFL with LoRA below DepthFL frozen at its last exit).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch import nn

from finished_run import global_model, load_finished


def summaries(model, x: torch.Tensor, block: int, chunk: int = 512) -> torch.Tensor:
    """(N, D): the last exit's summary (its ``pool``) of every document of ``x``, after block ``block``."""
    out = []
    with torch.no_grad():
        for i in range(0, len(x), chunk):
            xb = x[i:i + chunk]
            h = next(h for b, h in model.hidden(xb) if b == block)
            out.append(model.exits[-1].pool(h, model.token_mask(xb)))
    return torch.cat(out)


def probe_accuracy(f_train, y_train, f_test, y_test, classes: int, steps: int = 300) -> float:
    """Test accuracy of a fresh LayerNorm + Linear trained on (f_train, y_train)."""
    torch.manual_seed(0)
    head = nn.Sequential(nn.LayerNorm(f_train.shape[1]), nn.Linear(f_train.shape[1], classes))
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(head(f_train), y_train).backward()
        opt.step()
    with torch.no_grad():
        return (head(f_test).argmax(1) == y_test).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--train-docs", type=int, default=4000)
    parser.add_argument("--test-docs", type=int, default=3000)
    args = parser.parse_args()

    sim = load_finished(args.run_dir)
    pretrained = sim.method.init_state(sim.cfg.seed).params
    g = torch.Generator().manual_seed(0)
    train = torch.randperm(len(sim.x_train), generator=g)[:args.train_docs]
    test = torch.randperm(len(sim.x_test), generator=g)[:args.test_docs]
    y_train, y_test = sim.y_train[train], sim.y_test[test]
    result = {"run": args.run_dir.name, "train_docs": len(train), "test_docs": len(test)}
    for name, params in (("pretrained", pretrained), ("final", sim.state.params)):
        model = global_model(sim, params).eval()
        block = model.exit_after[-1]
        f_train, f_test = summaries(model, sim.x_train[train], block), summaries(model, sim.x_test[test], block)
        with torch.no_grad():
            own = (model.exits[-1].head(f_test).argmax(1) == y_test).float().mean().item()
        probe = probe_accuracy(f_train, y_train, f_test, y_test, sim.dataset.num_classes)
        result[name] = {"own_head": round(100 * own, 2), "probe": round(100 * probe, 2)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
