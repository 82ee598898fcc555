"""Golden runs: every method on digits, a few rounds, 2 seeds (a refactor must keep them bit-identical).

``python tests/goldens.py`` records ``tests/goldens.json``; ``tests/test_goldens.py`` re-runs every
case and compares its per-round metrics and a SHA-256 of its final weights with the record.
Recorded before the server/client seam refactor (commit 377917c), on the machine named in the file.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import torch

BASE = dict(dataset="digits", model_width=0.25, num_clients=20, client_fraction=0.25, rounds=3,
            batch_size=16, lr=0.05, checkpoint_every=2)
SEEDS = (0, 1)
CASES = {
    "alllarge": dict(method="alllarge"),
    "alllarge-fedprox": dict(method="alllarge", prox_mu=0.01),
    "alllarge-fedadam": dict(method="alllarge", server_opt="fedadam", server_lr=0.01),
    "alllarge-feddyn": dict(method="alllarge", server_opt="feddyn"),
    "allsmall": dict(method="allsmall"),
    "exclusivefl-level2": dict(method="exclusivefl", global_level=2),
    "exclusivefl-feddyn-kd": dict(method="exclusivefl", server_opt="feddyn", kd_weight=1.0, inference="ensemble"),
    "decoupled-dynamic": dict(method="decoupled", scenario="dynamic"),
    "depthfl": dict(method="depthfl"),
    "depthfl-dynamic-ramp": dict(method="depthfl", scenario="dynamic", kd_ramp=2 / 3),
    "depthfl-memory-budget": dict(method="depthfl", budget="memory"),
    "depthfl-fedavg-maximum": dict(method="depthfl-fedavg", scenario="maximum"),
    "inclusivefl-vit-md": dict(method="inclusivefl", model="vit", model_width=1.0, levels=3, md_beta=0.2,
                               server_lr=0.05),
    "inclusivefl-womd": dict(method="inclusivefl-womd", model="cnn"),
    # recorded before label masking, which HeteroFL now does by default: some digits clients lack a class
    "heterofl": dict(method="heterofl", label_mask=False),
    "heterofl-macs-budget": dict(method="heterofl", budget="macs", budget_ratios=[0.1, 0.3, 0.35, 1.0],
                                 label_mask=False),
    "sheterofl": dict(method="sheterofl", label_mask=False),
    "scalefl-local": dict(method="scalefl", client_test_fraction=0.2),
}
ROUND_KEYS = ("round", "lr", "clients", "train_loss", "bytes_down", "bytes_up", "eval", "local_accuracy")


def weights_sha256(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the names, dtypes, shapes and bytes of a state dict, in name order."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def run_case(case: str, seed: int, out: str) -> dict:
    """The recorded outcome of one golden run: per-round metrics and the final weights' hash."""
    from hetfl.methods import config_from
    from hetfl.sim import Simulation

    cfg = config_from({**BASE, **CASES[case], "seed": seed, "out": out, "name": f"{case}-s{seed}"})
    summary = Simulation(cfg).run(progress=False)
    rounds = [json.loads(line) for line in Path(summary["run_dir"], "metrics.jsonl").read_text().splitlines()]
    final = torch.load(Path(summary["run_dir"], "final_model.pt"), weights_only=True)
    return {"rounds": [{k: r[k] for k in ROUND_KEYS} for r in rounds], "weights_sha256": weights_sha256(final)}


def machine() -> dict:
    """What bit-identity depends on: the torch build, the CPU kernels it picks and the CPU's instruction-set
    flags (two AVX512 CPUs with different extensions, e.g. VNNI or AMX, get different oneDNN kernels)."""
    flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), []) if Path("/proc/cpuinfo").exists() else []
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(),
            "cpu_flags": hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:12]}


if __name__ == "__main__":
    results = {}
    with tempfile.TemporaryDirectory() as out:
        for case in CASES:
            for seed in SEEDS:
                results[f"{case}-s{seed}"] = run_case(case, seed, out)
                print(case, seed, results[f"{case}-s{seed}"]["weights_sha256"][:12], file=sys.stderr)
    path = Path(__file__).with_name("goldens.json")
    path.write_text(json.dumps({"machine": machine(), "runs": results}, indent=1) + "\n")
    print(f"wrote {path}")
