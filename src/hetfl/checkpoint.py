"""Checkpoints and per-client state on disk, both written atomically.

A checkpoint folder holds the round, the global state, the server optimizer's state and a
hard-link snapshot of the per-client state folder taken at that round. Client state files are
only ever replaced (write + rename), never modified in place, so the snapshot costs no copy and
stays exactly what it was; ``--resume`` restores it, which makes a resumed run bit-identical.

A checkpoint is written to ``checkpoint.tmp`` and swapped in by two renames (``checkpoint`` ->
``checkpoint.old``, ``checkpoint.tmp`` -> ``checkpoint``), then ``checkpoint.old`` is deleted.
``recover_checkpoint`` turns whatever a kill left at any step back into one checkpoint.
"""

from __future__ import annotations

import dataclasses

import os
import shutil
from pathlib import Path

import torch

from .errors import HetflError
from .rundir import atomic_torch_save, crash_point, readable_torch_file, remove_tree
from .slicing import State

FORMAT = "hetfl-checkpoint/2"  # /2: the whole ServerState (params, optimizer state, method state)


class ClientStateStore:
    """Each client's persistent state (global-shaped tensors) in its own file, loaded on demand."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def _path(self, client: int) -> Path:
        return self.root / f"{client}.pt"

    def load(self, client: int, device: torch.device | str = "cpu") -> State | None:
        """The client's state, or None before its first round."""
        path = self._path(client)
        return torch.load(path, map_location=device, weights_only=True) if path.exists() else None

    def save(self, client: int, state: State) -> None:
        """Replace the client's state file."""
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_torch_save({k: v.cpu() for k, v in state.items()}, self._path(client))

    def snapshot(self, dest: Path) -> None:
        """Hard-link every state file into ``dest`` (a copy where links are impossible)."""
        dest.mkdir(parents=True, exist_ok=True)
        if self.root.exists():
            for f in self.root.glob("*.pt"):
                try:
                    os.link(f, dest / f.name)
                except OSError:
                    shutil.copy2(f, dest / f.name)

    def restore(self, src: Path) -> None:
        """Make the store hold exactly the files of snapshot ``src``."""
        shutil.rmtree(self.root, ignore_errors=True)
        ClientStateStore(src).snapshot(self.root)


def recover_checkpoint(run_dir: Path) -> None:
    """Returns None; leaves ``run_dir/checkpoint`` as the last complete checkpoint (if any) and no leftovers.

    ``checkpoint.old`` is complete whenever ``checkpoint`` is missing (it is only ever deleted
    after ``checkpoint`` is in place), and ``checkpoint.tmp`` is never trusted.
    """
    final, tmp, old = run_dir / "checkpoint", run_dir / "checkpoint.tmp", run_dir / "checkpoint.old"
    if final.exists():
        remove_tree(old)  # killed while deleting it: os.replace could never rename onto it again
    elif old.exists():
        os.replace(old, final)  # killed between the two renames
    remove_tree(tmp)  # killed while writing it


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a checkpoint, counting one a kill left as ``checkpoint.old``."""
    return (run_dir / "checkpoint").exists() or (run_dir / "checkpoint.old").exists()


def save_checkpoint(run_dir: Path, payload: dict, clients: ClientStateStore) -> None:
    """Write ``run_dir/checkpoint`` atomically: the payload plus a snapshot of the client state."""
    final, tmp, old = run_dir / "checkpoint", run_dir / "checkpoint.tmp", run_dir / "checkpoint.old"
    recover_checkpoint(run_dir)
    tmp.mkdir()
    clients.snapshot(tmp / "client_state")
    files = {f.name: f.stat().st_size for f in (tmp / "client_state").glob("*.pt")}
    torch.save({"format": FORMAT, **payload, "client_files": files}, tmp / "state.pt")
    crash_point("checkpoint:written")
    if final.exists():
        os.replace(final, old)
        crash_point("checkpoint:moved-to-old")
    os.replace(tmp, final)
    crash_point("checkpoint:renamed")
    if old.exists():
        (old / "state.pt").unlink()
        crash_point("checkpoint:old-half-deleted")
        remove_tree(old)


def load_checkpoint(run_dir: Path, config) -> dict | None:
    """The checkpoint payload of ``run_dir``, checked to be a hetfl checkpoint of this very config
    with intact client state files; None when the run has no checkpoint yet."""
    recover_checkpoint(run_dir)
    folder = run_dir / "checkpoint"
    path = folder / "state.pt"
    if not folder.exists():
        return None
    if not path.exists():
        raise HetflError(f"checkpoint {folder} has no state.pt; it is damaged: delete the run folder and start again")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a damaged file
        raise HetflError(f"checkpoint {path} is corrupt or unreadable ({type(e).__name__}); "
                         "delete the run folder and start again") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise HetflError(f"{path} is not a hetfl checkpoint (expected format {FORMAT})")
    if not isinstance(payload.get("config"), dict) or not same_config(payload["config"], config):
        raise HetflError(f"checkpoint {path} belongs to another experiment: its config differs from "
                         f"{run_dir / 'config.json'}")
    payload["client_state_dir"] = folder / "client_state"
    _check_client_files(payload["client_state_dir"], payload.get("client_files"))
    return payload


def checked_payload(payload: dict, path: Path, rounds: int, params: dict[str, torch.Tensor]) -> dict:
    """``payload`` after checking what resume takes from it: a round in [1, ``rounds``], a finite elapsed time, and a
    server state whose parameters have the names, shapes and dtypes of ``params`` (the config's model) and, like
    every tensor of the state, finite values. HetflError names the first problem."""
    def bad(what: str) -> HetflError:
        return HetflError(f"checkpoint {path} {what}; it is damaged: delete the run folder and start again")

    round_index = payload.get("round")
    if type(round_index) is not int or not 1 <= round_index <= rounds:
        raise bad(f"holds round {round_index!r}, not a round in 1..{rounds}")
    elapsed = payload.get("elapsed")
    if not isinstance(elapsed, (int, float)) or isinstance(elapsed, bool) or not 0 <= elapsed < float("inf"):
        raise bad(f"holds elapsed time {elapsed!r}, not a finite number of seconds")
    state = payload.get("state")
    parts = ("params", "opt", "extra")
    if not isinstance(state, dict) or "params" not in state or \
            not all(isinstance(state.get(k, {}), dict) for k in parts):
        raise bad("lacks its server state (a table of params, opt and extra)")
    saved = state["params"]
    if set(saved) != set(params):
        raise bad(f"holds the parameters of another model ({len(saved)} tensors; the config's has {len(params)})")
    for name, tensor in saved.items():
        want = params[name]
        if not isinstance(tensor, torch.Tensor) or tensor.shape != want.shape or tensor.dtype != want.dtype:
            got = f"{tuple(tensor.shape)} {tensor.dtype}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise bad(f"holds {name} of shape {got}, not {tuple(want.shape)} {want.dtype}")
    for part in parts:
        for name, tensor in state.get(part, {}).items():
            if not isinstance(tensor, torch.Tensor):
                raise bad(f"holds {part} {name} that is no tensor")
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise bad(f"holds {part} {name} with non-finite values (NaN or inf)")
    return payload


WHERE_IT_RUNS = ("device",)  # the same experiment on any device: a run begun on an accelerator goes on on a CPU


def same_config(saved: dict, config) -> bool:
    """Whether a checkpoint's resolved config ``saved`` is ``config``'s, whatever device each names
    (``WHERE_IT_RUNS``); an option only one of them records (added to hetfl after the checkpoint was written, or
    recorded only when set) matches at its default."""
    current, defaults = config.to_dict(), dataclasses.asdict(type(config)())
    saved = {k: v for k, v in saved.items() if k not in WHERE_IT_RUNS}
    current = {k: v for k, v in current.items() if k not in WHERE_IT_RUNS}

    def at_default(key, value) -> bool:
        return key in defaults and defaults[key] == value

    return all(saved[k] == v if k in saved else at_default(k, v) for k, v in current.items()) \
        and all(k in current or at_default(k, v) for k, v in saved.items())


def _check_client_files(folder: Path, expected: dict[str, int] | None) -> None:
    """Returns None; raises HetflError if a client state file of the snapshot is missing, cut short or unreadable."""
    found = {f.name: f.stat().st_size for f in folder.glob("*.pt")} if folder.exists() else {}
    names = sorted(set(found) | set(expected or {}))
    for name in names:
        path = folder / name
        if expected is not None and found.get(name) != expected.get(name):
            what = "missing" if name not in found else "unexpected" if name not in expected else \
                f"{found[name]} bytes instead of {expected[name]}"
            bad = f"{path} is {what}"
        elif not readable_torch_file(path):
            bad = f"{path} is unreadable"
        else:
            continue
        raise HetflError(f"client state file {bad}; the run cannot be resumed exactly: delete the run folder "
                         "and start again")
