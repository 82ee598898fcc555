"""``hetfl bench chaos``: a soak of random ``kill -9``s, each followed by a plain ``--resume``.

A multi-round DepthFL run on digits (small) is started in a subprocess and SIGKILLed at a random
moment, then resumed with ``hetfl run --resume``, killed again, and so on until the wanted number
of kills; the last resume runs to the end. The moment is uniform from half the process's startup
(imports, data, resume's recovery) to the startup plus 4 / kills (at most 0.8) of the run's
training time, so the kills hit every phase (startup, recovery, rounds, checkpoints, final writes) and are spread
over the whole run. No folder is ever repaired by hand: after a kill the next command is the
resume, or the original command when the kill came before the run folder existed. The final
weights must equal those of the uninterrupted run, and every metrics line must be there once.
A run that finishes before its share of kills is done starts another (an "episode").

Every process runs on one thread, so the same kernels sum in the same order in all of them.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ..config import Config
from ..methods import config_from

TIMEOUT = 600  # seconds for one process; a run takes seconds


def chaos_config(out: Path, rounds: int) -> Config:
    """The soaked run: DepthFL (FedDyn state on disk, KD) on digits, a quarter-width CNN."""
    return config_from({"method": "depthfl", "dataset": "digits", "model_width": 0.25, "num_clients": 20,
                             "client_fraction": 0.25, "rounds": rounds, "batch_size": 16, "checkpoint_every": 2,
                             "out": str(out)})


def _flags(cfg: Config) -> list[str]:
    """``cfg`` as `hetfl run` flags."""
    out = []
    for k, v in cfg.to_dict().items():
        v = ",".join(map(str, v)) if isinstance(v, list) else v
        if v != "":
            out.append(f"--{k.replace('_', '-')}={v}")
    return out


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "HETFL_CRASH_AT"}
    return {**env, "OMP_NUM_THREADS": "1"}


def run_chaos(kills: int = 20, rounds: int = 40, seed: int = 0, out: str | None = None) -> dict:
    """The soak's tally (kills, launches, episodes, failures); prints a line per kill and a verdict last."""
    root = Path(out or tempfile.mkdtemp(prefix="hetfl-chaos-"))
    cfg = chaos_config(root, rounds)
    hetfl = [sys.executable, "-m", "hetfl", "run", "--quiet"]
    started = time.monotonic()
    ref = subprocess.run([*hetfl, *_flags(cfg.replace(name="reference"))], env=_env(), capture_output=True,
                         text=True, timeout=TIMEOUT)
    if ref.returncode != 0:
        raise RuntimeError(f"the uninterrupted run failed: {ref.stderr}")
    span = time.monotonic() - started
    reference = torch.load(root / "reference" / "final_model.pt", weights_only=True)
    training = sum(json.loads(line)["seconds"] for line in (root / "reference" / "metrics.jsonl").open())
    startup = max(span - training, 0.1)
    window = (0.5 * startup, startup + min(4 / max(kills, 1), 0.8) * training)  # a fresh run never ends first
    print(f"chaos: uninterrupted run of {rounds} rounds took {span:.1f} s ({training:.1f} s in rounds); "
          f"killing at random moments in [{window[0]:.1f}, {window[1]:.1f}] s of each process", flush=True)
    rng = random.Random(seed)
    tally = {"kills": 0, "launches": 0, "episodes": 0, "identical": 0, "failures": []}
    while tally["kills"] < kills or tally["episodes"] == 0:
        tally["episodes"] += 1
        name = f"chaos-{tally['episodes']}"
        run_dir = root / name
        while True:
            fresh = not run_dir.exists()  # killed before the folder existed: the same command again
            command = [*hetfl, *_flags(cfg.replace(name=name))] if fresh else [*hetfl, "--resume", str(run_dir)]
            proc = subprocess.Popen(command, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            tally["launches"] += 1
            if tally["kills"] < kills:
                try:
                    proc.wait(rng.uniform(*window))
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGKILL)
            _, err = proc.communicate(timeout=TIMEOUT)
            if proc.returncode == -signal.SIGKILL:
                tally["kills"] += 1
                metrics = run_dir / "metrics.jsonl"
                logged = metrics.read_text().count("\n") if metrics.exists() else 0
                print(f"chaos: kill {tally['kills']} ({'resume' if '--resume' in command else 'start'} of {name}), "
                      f"{logged} round lines on disk", flush=True)
                continue
            if proc.returncode != 0:  # the resume needed a hand repair
                tally["failures"].append(f"{name}: {' '.join(command[3:])} exited {proc.returncode}: {err.strip()}")
                break
            final = torch.load(run_dir / "final_model.pt", weights_only=True)
            rounds_logged = [json.loads(line)["round"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            same = final.keys() == reference.keys() and all(torch.equal(final[k], reference[k]) for k in final)
            if same and rounds_logged == list(range(1, rounds + 1)):
                tally["identical"] += 1
            else:
                tally["failures"].append(f"{name}: final weights {'equal' if same else 'differ'}, "
                                         f"rounds logged {rounds_logged}")
            break
        if tally["failures"]:
            break
    ok = not tally["failures"] and tally["identical"] == tally["episodes"]
    for failure in tally["failures"]:
        print(f"chaos: FAILED {failure}")
    print(f"chaos: {tally['kills']} kills, {tally['launches']} launches, {tally['episodes']} episode(s), "
          f"{len(tally['failures'])} needing a hand repair or differing; final weights identical to the "
          f"uninterrupted run: {'yes' if ok else 'NO'} ({root})")
    tally["ok"] = ok
    return tally
