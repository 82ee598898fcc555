"""Bad input never reaches a traceback: a table of bad values, files and folders across every subcommand.

Each case runs ``hetfl ARGS`` in this process on a folder prepared for it and asserts the contract of
``errors.HetflError``: exit code 2, one line on stderr that starts ``hetfl: error:``, nothing on stdout (the
input is checked before any work, not after it), and no file created,
changed or removed anywhere under the case's folder (a ``.lock``'s content aside: a refused resume
writes its pid into the lock it held, and the lock file itself stays).

The option cases are generated from the options' declared ranges (``options.Range``), so an option
added later is covered by the same rows: a value just outside each bound, NaN, infinities, a word,
and an integer no int64 holds.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from hetfl.cli import main, method_option_fields
from hetfl.config import Config
from hetfl.options import option_fields

BASE = ["--dataset", "digits", "--num-clients", "4", "--client-fraction", "0.5", "--rounds", "1",
        "--model-width", "0.25", "--out", "{tmp}/runs"]
RUN = ["run", "--quiet", *BASE]


@dataclass
class Case:
    """``hetfl`` with ``argv`` ({tmp}: the case's folder) after ``setup(tmp)`` prepared its files."""

    id: str
    argv: list[str]
    setup: Callable[[Path], None] | None = None
    says: str = ""  # a fragment the error line must hold


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` -> a hash of its content ("dir" for folders; a lock's content is not compared)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_dir():
            out[rel] = "dir"
        elif p.name == ".lock":
            out[rel] = "lock"
        else:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


CASE_SECONDS = 60  # a refusal takes well under a second; an accepted bad value would start training


def _too_long(signum, frame):
    raise TimeoutError(f"not refused within {CASE_SECONDS} s: the bad input was accepted")


def refused(case: Case, tmp: Path, capsys) -> str:
    """The error line of ``case``, after checking the contract."""
    if case.setup:
        case.setup(tmp)
    before = snapshot(tmp)
    signal.signal(signal.SIGALRM, _too_long)
    signal.alarm(CASE_SECONDS)
    try:
        code = main([a.replace("{tmp}", str(tmp)) for a in case.argv])
    finally:
        signal.alarm(0)
    captured = capsys.readouterr()
    err = captured.err
    lines = err.strip().splitlines()
    assert code == 2, f"exit {code}: {err}"
    assert len(lines) == 1 and lines[0].startswith("hetfl: error: "), err
    assert captured.out == "", f"work done before the refusal: {captured.out[:300]}"
    assert snapshot(tmp) == before, f"files changed: {set(snapshot(tmp).items()) ^ set(before.items())}"
    assert case.says in lines[0], lines[0]
    return lines[0]


# ---- options, from their declared ranges ---------------------------------------------------------------------
def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def option_cases() -> list[Case]:
    """For every numeric option of the config and the methods: NaN, +-inf, a word, an int no int64 holds, and a value
    just outside each bound of its range."""
    from hetfl.methods import option_owners

    cases = []
    owners = option_owners()
    generic = {name: f for name, f in option_fields(Config).items() if name in Config.field_names()}
    for name, f in {**generic, **method_option_fields()}.items():
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        if not any(t in kind for t in ("int", "float")):
            continue
        method = [] if name in generic else ["--method", owners[name][0]]
        if "list" in kind:
            bad = ["1,nan", "inf", "abc", "1,,x"]
        elif "float" in kind:
            bad = ["nan", "inf", "-inf", "abc", "1e400"]
        else:
            bad = ["abc", "1.5", str(2 ** 70), "nan"]
        valid = f.metadata.get("range")
        if valid is not None:
            bad += valid.edges(integer="int" in kind and "list" not in kind)
        for value in bad:
            cases.append(Case(f"{name}={value}", [*RUN, *method, _flag(name), value], says=name))
    return cases


# ---- specific values ---------------------------------------------------------------------------------------
VALUES = [
    Case("lr 1e308", [*RUN, "--lr", "1e308"], says="lr"),
    Case("model width inf", [*RUN, "--model-width", "inf"], says="model_width"),
    Case("model width 1e6 (memory)", [*RUN, "--model-width", "1e6"], says="model_width"),
    Case("seed -1", [*RUN, "--seed", "-1"], says="seed"),
    Case("seed 2^70", [*RUN, "--seed", str(2 ** 70)], says="seed"),
    Case("alpha inf", [*RUN, "--partition", "dirichlet", "--alpha", "inf"], says="alpha"),
    Case("batch size 1 under BatchNorm", [*RUN, "--batch-size", "1"], says="batch_size"),
    Case("--config empty", ["run", "--config", ""], says="--config"),
    Case("--resume empty", ["run", "--resume", ""], says="--resume"),
    Case("deploy --config empty", ["deploy", "--config", ""], says="--config"),
    Case("deploy --resume empty", ["deploy", "--resume", ""], says="--resume"),
    Case("deploy --nodes 0", ["deploy", "--nodes", "0", *BASE], says="nodes"),
    Case("deploy lr nan", ["deploy", *BASE, "--lr", "nan"], says="lr"),
    Case("costs model width inf", ["costs", "cnn", "--model-width", "inf", "--no-latency"], says="model_width"),
    Case("costs batch size 0", ["costs", "cnn", "--batch-size", "0", "--no-latency"], says="batch_size"),
    Case("describe alpha nan", ["data", "describe", "--dataset", "digits", "--partition", "dirichlet", "--alpha", "nan"],
         says="alpha"),
    Case("describe clients 0", ["data", "describe", "--dataset", "digits", "--num-clients", "0"], says="num_clients"),
    Case("costs unknown model", ["costs", "vgg", "--no-latency"], says="vgg"),
    Case("costs model given twice", ["costs", "cnn", "--model", "resnet18", "--no-latency"], says="model"),
    Case("costs kd weight nan", ["costs", "cnn", "--method", "depthfl", "--kd-weight", "nan", "--no-latency"],
         says="kd_weight"),
    Case("costs seed 2^70", ["costs", "cnn", "--seed", str(2 ** 70), "--no-latency"], says="seed"),
    Case("costs a missing npz", ["costs", "cnn", "--dataset", "npz:{tmp}/none.npz", "--no-latency"], says="none.npz"),
    Case("deploy node config malformed", ["deploy", *BASE, "--nodes", "4", "--node-config", "level=1"],
         says="node-config"),
    Case("deploy node config node 9 of 4", ["deploy", *BASE, "--nodes", "4", "--node-config", "9:level=1"],
         says="9"),
    Case("deploy resume a folder without config", ["deploy", "--resume", "{tmp}"], says="config.json"),
    Case("deploy batch size 1 under BatchNorm", ["deploy", *BASE, "--nodes", "4", "--batch-size", "1"],
         says="batch_size"),
    Case("bench speed repeats 0", ["bench", "speed", "--repeats", "0"], says="repeats"),
    Case("bench throughput repeats -1", ["bench", "throughput", "--repeats", "-1"], says="repeats"),
    Case("bench rounds 0", ["bench", "demo", "--rounds", "0", "--out", "{tmp}/r"], says="rounds"),
    Case("bench seeds abc", ["bench", "demo", "--seeds", "abc", "--out", "{tmp}/r"], says="seeds"),
    Case("bench seeds empty item", ["bench", "demo", "--seeds", "1,,2", "--out", "{tmp}/r"], says="seeds"),
    Case("bench seeds negative", ["bench", "demo", "--seeds=-1", "--out", "{tmp}/r"], says="seed"),
    Case("chaos seeds abc", ["bench", "chaos", "--seeds", "abc", "--out", "{tmp}/r"], says="seeds"),
    Case("chaos kills -1", ["bench", "chaos", "--kills", "-1", "--out", "{tmp}/r"], says="kills"),
    Case("chaos rounds 0", ["bench", "chaos", "--rounds", "0", "--out", "{tmp}/r"], says="rounds"),
    Case("suite workers 0", ["bench", "suite", "demo", "--workers", "0", "--time-budget", "60", "--out", "{tmp}/r"],
         says="workers"),
    Case("suite budget nan", ["bench", "suite", "demo", "--time-budget", "nan", "--out", "{tmp}/r"],
         says="time-budget"),
    Case("suite budget -5", ["bench", "suite", "demo", "--time-budget=-5", "--out", "{tmp}/r"], says="time-budget"),
    Case("suite budget inf", ["bench", "suite", "demo", "--time-budget", "inf", "--out", "{tmp}/r"],
         says="time-budget"),
    Case("suite no preset", ["bench", "suite", "--time-budget", "60", "--out", "{tmp}/r"], says="preset"),
    Case("bench checkpoint rounds 0", ["bench", "checkpoint", "--rounds", "0"], says="rounds"),
    Case("bench flower rounds -2", ["bench", "flower", "--rounds=-2", "--out", "{tmp}/r"], says="rounds"),
    Case("bench memory unknown model", ["bench", "memory", "--model", "vgg"], says="vgg"),
    Case("bench device nonsense", ["bench", "demo", "--device", "tpu9", "--out", "{tmp}/r"], says="tpu9"),
    Case("bench --out an existing file", ["bench", "demo", "--out", "{tmp}/f", "--runs-dir", "{tmp}/runs"],
         lambda tmp: (tmp / "f").write_text("x"), "--out"),
    Case("bench --out below a file", ["bench", "demo", "--out", "{tmp}/f/r", "--runs-dir", "{tmp}/runs"],
         lambda tmp: (tmp / "f").write_text("x"), "--out"),
    Case("bench --runs-dir an existing file", ["bench", "demo", "--out", "{tmp}/r", "--runs-dir", "{tmp}/f"],
         lambda tmp: (tmp / "f").write_text("x"), "--runs-dir"),
    Case("bench --out unwritable", ["bench", "demo", "--out", "/proc/r", "--runs-dir", "{tmp}/runs"], says="/proc"),
    Case("suite --out an existing file", ["bench", "suite", "demo", "--time-budget", "60", "--out", "{tmp}/f",
                                          "--runs-dir", "{tmp}/runs"], lambda tmp: (tmp / "f").write_text("x"), "--out"),
    Case("flower bench --out an existing file", ["bench", "flower", "--out", "{tmp}/f"],
         lambda tmp: (tmp / "f").write_text("x"), "--out"),
    Case("run name too long", [*RUN, "--name", "n" * 250], says="name"),
    Case("run out folder name too long", [*RUN[:-1], "{tmp}/" + "o" * 300], says="out"),
    Case("run path too long", [*RUN[:-1], "{tmp}/" + "/".join(["p" * 200] * 21)], says="path"),
    Case("run default name too long", ["run", "--quiet", "--dataset", "npz:{tmp}/" + "d" * 240 + ".npz",
                                       "--out", "{tmp}/runs"], says="name"),
]


# ---- TOML config files -------------------------------------------------------------------------------------
def toml_file(text: str | bytes, name: str = "c.toml") -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        data = text.encode() if isinstance(text, str) else text
        (tmp / name).write_bytes(data.replace(b"{tmp}", str(tmp).encode()))
    return setup


TOML_BASE = 'dataset = "digits"\nnum_clients = 4\nclient_fraction = 0.5\nmodel_width = 0.25\nout = "{tmp}/runs"\n'
TOMLS = [
    ("latin-1", (TOML_BASE + 'name = "caf\xe9"\n').encode("latin-1"), "UTF-8"),
    ("binary", bytes(range(256)), "UTF-8"),
    ("not toml", "rounds = = 3\n", "TOML"),
    ("rounds = true", TOML_BASE + "rounds = true\n", "rounds"),
    ("flip = 5", TOML_BASE + "flip = 5\n", "flip"),
    ("flip = 1", TOML_BASE + "flip = 1\n", "flip"),
    ("lr_steps = [1.7]", TOML_BASE + "lr_steps = [1.7]\n", "lr_steps"),
    ("lr_steps = 3", TOML_BASE + "lr_steps = 3\n", "lr_steps"),
    ("lr = 'fast'", TOML_BASE + "lr = 'fast'\n", "lr"),
    ("lr = nan", TOML_BASE + "lr = nan\n", "lr"),
    ("lr = inf", TOML_BASE + "lr = inf\n", "lr"),
    ("lr = true", TOML_BASE + "lr = true\n", "lr"),
    ("seed = 2^63 - 1", TOML_BASE + "seed = 9223372036854775807\n", "seed"),
    ("seed = -1", TOML_BASE + "seed = -1\n", "seed"),
    ("method = 3", TOML_BASE + "method = 3\n", "method"),
    ("dataset = a table", TOML_BASE.replace('dataset = "digits"\n', "") + "[dataset]\nname = 'digits'\n", "dataset"),
    ("exits = 'all'", TOML_BASE + "exits = 'all'\n", "exits"),
    ("widths = [[0.5]]", TOML_BASE + "widths = [[0.5]]\n", "widths"),
    ("budget_ratios = [0.5, true]", TOML_BASE + "budget_ratios = [0.5, true]\n", "budget_ratios"),
    ("num_clients = 4.0", TOML_BASE.replace("num_clients = 4", "num_clients = 4.5"), "num_clients"),
    ("a date", TOML_BASE + "rounds = 1979-05-27\n", "rounds"),
    ("unknown key", TOML_BASE + "colour = 'red'\n", "colour"),
    ("kd_weight nan", TOML_BASE + "method = 'depthfl'\nkd_weight = nan\n", "kd_weight"),
]
FILES = [Case(f"toml {label}", ["run", "--quiet", "--config", "{tmp}/c.toml"], toml_file(text), says)
         for label, text, says in TOMLS]
FILES += [
    Case("config is a folder", ["run", "--config", "{tmp}"], says="config"),
    Case("config missing", ["run", "--config", "{tmp}/none.toml"], says="none.toml"),
    Case("deploy toml latin-1", ["deploy", "--config", "{tmp}/c.toml"], toml_file(TOMLS[0][1]), "UTF-8"),
]


# ---- bench presets -----------------------------------------------------------------------------------------
PRESETS = [
    ("runs is an int", "runs = 3\n", "runs"),
    ("runs are strings", "runs = ['alllarge', 'allsmall']\n", "runs"),
    ("runs empty", "runs = []\n", "runs"),
    ("a run's method unknown", "[[runs]]\nmethod = 'fedbest'\n", "fedbest"),
    ("base is a list", "base = [1, 2]\n[[runs]]\nmethod = 'alllarge'\n", "base"),
    ("seeds are words", "seeds = ['a']\n[[runs]]\nmethod = 'alllarge'\n", "seeds"),
    ("seeds is an int", "seeds = 3\n[[runs]]\nmethod = 'alllarge'\n", "seeds"),
    ("a run's lr is nan", "[[runs]]\nmethod = 'alllarge'\nlr = nan\n", "lr"),
    ("label twice", "[[runs]]\nmethod = 'alllarge'\n[[runs]]\nmethod = 'alllarge'\n", "label"),
    ("latin-1", "# caf\xe9\n[[runs]]\nmethod = 'alllarge'\n".encode("latin-1"), "UTF-8"),
    ("claims is a string", "claims = 'x'\n[[runs]]\nmethod = 'alllarge'\n", "claims"),
    ("extends itself", "extends = 'p.toml'\n[[runs]]\nmethod = 'alllarge'\n", "extends loops back"),
    ("extends an unknown preset", "extends = 'nope'\n[[runs]]\nmethod = 'alllarge'\n", "'nope' is unknown"),
    ("extends a number", "extends = 3\n[[runs]]\nmethod = 'alllarge'\n", "extends must name"),
]
FILES += [Case(f"preset {label}", ["bench", "{tmp}/p.toml", "--out", "{tmp}/r", "--runs-dir", "{tmp}/runs"],
               toml_file(text, "p.toml"), says) for label, text, says in PRESETS]
def results_file(name: str, text: str | bytes) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / "r").mkdir()
        (tmp / "r" / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return setup


REPORT = ["bench", "demo", "--out", "{tmp}/r", "--runs-dir", "{tmp}/runs", "--report-only"]
FILES += [
    Case("summaries.json not JSON", REPORT, results_file("summaries.json", "{"), "summaries.json"),
    Case("summaries.json a list", REPORT, results_file("summaries.json", "[1]"), "summaries.json"),
    Case("summaries.json runs lack curves", REPORT, results_file("summaries.json", '{"AllSmall": [{"seed": 0}]}'),
         "curve"),
    Case("summaries.json runs lack seeds", REPORT, results_file("summaries.json", '{"AllSmall": [{"curve": []}]}'),
         "summaries.json"),
    Case("finished-runs.json a list", [*REPORT, "--reuse-saved"], results_file("finished-runs.json", "[1, 2]"),
         "finished-runs.json"),
    Case("finished-runs.json binary", [*REPORT, "--reuse-saved"], results_file("finished-runs.json", b"\xff\xfe"),
         "finished-runs.json"),
]
FILES += [
    Case("preset is a folder", ["bench", "{tmp}/p.toml", "--out", "{tmp}/r"],
         lambda tmp: (tmp / "p.toml").mkdir(), "p.toml"),
    Case("suite preset is a folder", ["bench", "suite", "{tmp}/p.toml", "--time-budget", "9", "--out", "{tmp}/r"],
         lambda tmp: (tmp / "p.toml").mkdir(), "p.toml"),
]


# ---- data files --------------------------------------------------------------------------------------------
def npz(**arrays) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        rng = np.random.default_rng(0)
        base = dict(x_train=rng.random((40, 8, 8)), y_train=np.arange(40) % 4, x_test=rng.random((12, 8, 8)),
                    y_test=np.arange(12) % 4)
        np.savez(tmp / "d.npz", **{**base, **arrays})
    return setup


NPZ = ["run", "--quiet", "--dataset", "npz:{tmp}/d.npz", "--num-clients", "4", "--client-fraction", "0.5",
       "--rounds", "1", "--model-width", "0.25", "--out", "{tmp}/runs"]
DATA = [
    Case("npz labels up to 2^40", NPZ, npz(y_train=np.r_[np.arange(39) % 4, 2 ** 40]), "label"),
    Case("npz string images", NPZ, npz(x_train=np.full((40, 8, 8), "a")), "x_train"),
    Case("npz object images", NPZ, npz(x_train=np.array([None] * 40)), "npz"),
    Case("npz empty test set", NPZ, npz(x_test=np.zeros((0, 8, 8)), y_test=np.zeros(0, int)), "test"),
    Case("npz 2x2 images", NPZ, npz(x_train=np.zeros((40, 2, 2)), x_test=np.zeros((12, 2, 2))), "2"),
    Case("npz 1-d images", NPZ, npz(x_train=np.zeros(40), x_test=np.zeros(12)), "x_train"),
    Case("npz complex images", NPZ, npz(x_train=np.zeros((40, 8, 8), complex)), "x_train"),
    Case("npz bool labels", NPZ, npz(y_train=np.ones(40, bool)), "y_train"),
    Case("npz float labels", NPZ, npz(y_train=np.arange(40) / 3), "y_train"),
    Case("npz one class", NPZ, npz(y_train=np.zeros(40, int), y_test=np.zeros(12, int)), "class"),
    Case("npz fewer samples than clients", [*NPZ, "--num-clients", "50", "--client-fraction", "0.1"],
         npz(x_train=np.zeros((20, 8, 8)), y_train=np.arange(20) % 4), "client"),
    Case("npz fewer samples than clients, test classes untrained",
         [*NPZ, "--num-clients", "50", "--client-fraction", "0.1"],
         npz(x_train=np.zeros((20, 8, 8)), y_train=np.arange(20) % 2), "client"),  # a warning, then the error
    Case("npz not a zip", NPZ, lambda tmp: (tmp / "d.npz").write_text("hello"), "zip"),
    Case("npz is a folder", NPZ, lambda tmp: (tmp / "d.npz").mkdir(), "d.npz"),
    Case("crop padding beyond the image", [*RUN, "--crop-padding", "100"], says="crop_padding"),
    # refused from the dataset's name, before its files are looked for (the case's machine need not hold them)
    Case("flip on text", ["run", "--dataset", "r8", "--flip", "true", "--out", "{tmp}/runs"], says="flip"),
    Case("crop on own text", ["run", "--dataset", "text:{tmp}/none", "--crop-padding", "2", "--out", "{tmp}/runs"],
         says="crop_padding"),
]


def cifar_folder(batch: bytes | None) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        folder = tmp / "cifar-10-batches-py"
        folder.mkdir()
        good = pickle.dumps({b"data": np.zeros((4, 3072), np.uint8), b"labels": [0, 1, 2, 3]})
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            (folder / name).write_bytes(good)
        (folder / "data_batch_3").write_bytes(batch)
    return setup


CIFAR = ["run", "--dataset", "cifar10", "--data-dir", "{tmp}", "--out", "{tmp}/runs"]
DATA += [
    Case("cifar batch truncated", CIFAR, cifar_folder(b"\x80\x04garbage"), "data_batch_3"),
    Case("cifar batch a list", CIFAR, cifar_folder(pickle.dumps([1, 2])), "data_batch_3"),
    Case("cifar batch wrong width", CIFAR, cifar_folder(pickle.dumps({b"data": np.zeros((4, 10), np.uint8),
                                                                     b"labels": [0, 1, 2, 3]})), "data_batch_3"),
    Case("cifar batch labels too short", CIFAR, cifar_folder(pickle.dumps({b"data": np.zeros((4, 3072), np.uint8),
                                                                          b"labels": [0]})), "data_batch_3"),
    Case("cifar batch labels words", CIFAR, cifar_folder(pickle.dumps({b"data": np.zeros((4, 3072), np.uint8),
                                                                      b"labels": ["a"] * 4})), "data_batch_3"),
    Case("cifar batch pickles code", CIFAR, cifar_folder(pickle.dumps(Path("x"))), "data_batch_3"),
    Case("cifar batch data words", CIFAR, cifar_folder(pickle.dumps({b"data": np.full((4, 3072), "a"),
                                                                    b"labels": [0, 1, 2, 3]})), "data_batch_3"),
    Case("cifar batch data a list of words", CIFAR, cifar_folder(pickle.dumps({b"data": [["x"] * 3072] * 4,
                                                                              b"labels": [0, 1, 2, 3]})),
         "data_batch_3"),
    Case("cifar batch data floats", CIFAR, cifar_folder(pickle.dumps({b"data": np.full((4, 3072), 0.5),
                                                                     b"labels": [0, 1, 2, 3]})), "data_batch_3"),
    Case("cifar batch data ragged", CIFAR, cifar_folder(pickle.dumps({b"data": [[0] * 3072, [0]],
                                                                     b"labels": [0, 1]})), "data_batch_3"),
    Case("cifar batch pixel 300", CIFAR, cifar_folder(pickle.dumps({b"data": np.full((4, 3072), 300),
                                                                   b"labels": [0, 1, 2, 3]})), "data_batch_3"),
    Case("cifar batch labels an array of words", CIFAR,
         cifar_folder(pickle.dumps({b"data": np.zeros((4, 3072), np.uint8), b"labels": np.array(["1"] * 4)})),
         "data_batch_3"),
    Case("cifar batch labels 2^64 - 1", CIFAR,
         cifar_folder(pickle.dumps({b"data": np.zeros((4, 3072), np.uint8),
                                    b"labels": np.full(4, 2 ** 64 - 1, np.uint64)})), "data_batch_3"),
]


# ---- run folders -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished one-round run folder (checkpointed), copied by each case that damages one."""
    out = tmp_path_factory.mktemp("finished")
    args = [a.replace("{tmp}", str(out)) for a in RUN]
    assert main([*args, "--name", "done", "--rounds", "2"]) == 0
    return out / "runs" / "done"


def damaged(change: Callable[[Path], None]) -> Callable[[Path], None]:
    """A setup: a copy of the finished run at {tmp}/run without its final files (so resume would train), then
    ``change(run)``."""
    def setup(tmp: Path) -> None:
        run = tmp / "run"
        shutil.copytree(DONE[0], run)
        for name in ("summary.json", "final_model.pt"):
            (run / name).unlink()
        change(run)
    return setup


DONE: list[Path] = []  # the finished run, set by the fixture for the setups


def write_json(name: str, value) -> Callable[[Path], None]:
    return lambda run: (run / name).write_text(json.dumps(value))


def edit_checkpoint(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def change(run: Path) -> None:
        path = run / "checkpoint" / "state.pt"
        payload = torch.load(path, weights_only=True)
        edit(payload)
        torch.save(payload, path)
    return change


def _first_param(payload: dict) -> torch.Tensor:
    params = payload["state"]["params"]
    return params[next(iter(params))]


def _set(payload: dict, key: str, value) -> None:
    payload[key] = value


def _nan_params(payload: dict) -> None:
    _first_param(payload).fill_(float("nan"))


def _reshape(payload: dict) -> None:
    params = payload["state"]["params"]
    name = next(iter(params))
    params[name] = torch.zeros(3, 3)


RESUME = ["run", "--quiet", "--resume", "{tmp}/run"]
FOLDERS = [
    Case("config.json a list", RESUME, damaged(write_json("config.json", [1, 2])), "config.json"),
    Case("config.json null", RESUME, damaged(write_json("config.json", None)), "config.json"),
    Case("config.json empty", RESUME, damaged(lambda run: (run / "config.json").write_text("")), "config.json"),
    Case("config.json lr nan", RESUME, damaged(lambda run: (run / "config.json").write_text(
        (run / "config.json").read_text().replace('"lr": 0.05', '"lr": NaN'))), "lr"),
    Case("config.json binary", RESUME, damaged(lambda run: (run / "config.json").write_bytes(b"\xff\xfe\x00")),
         "config.json"),
    Case("checkpoint lacks state", RESUME, damaged(edit_checkpoint(lambda p: p.pop("state"))), "state"),
    Case("checkpoint lacks round", RESUME, damaged(edit_checkpoint(lambda p: p.pop("round"))), "round"),
    Case("checkpoint round -5", RESUME, damaged(edit_checkpoint(lambda p: _set(p, "round", -5))), "round"),
    Case("checkpoint round 10^6", RESUME, damaged(edit_checkpoint(lambda p: _set(p, "round", 10 ** 6))), "round"),
    Case("checkpoint round a word", RESUME, damaged(edit_checkpoint(lambda p: _set(p, "round", "two"))), "round"),
    Case("checkpoint elapsed nan", RESUME, damaged(edit_checkpoint(lambda p: _set(p, "elapsed", float("nan")))),
         "elapsed"),
    Case("checkpoint NaN parameters", RESUME, damaged(edit_checkpoint(_nan_params)), "finite"),
    Case("checkpoint wrong shape", RESUME, damaged(edit_checkpoint(_reshape)), "shape"),
    Case("checkpoint state a list", RESUME, damaged(edit_checkpoint(lambda p: _set(p, "state", [1]))), "state"),
    Case("checkpoint is a folder", RESUME, damaged(lambda run: ((run / "checkpoint" / "state.pt").unlink(),
                                                                (run / "checkpoint" / "state.pt").mkdir())),
         "state.pt"),
    Case(".lock is a folder", RESUME, damaged(lambda run: ((run / ".lock").unlink(missing_ok=True),
                                                           (run / ".lock").mkdir())), ".lock"),
    Case("metrics.jsonl a list per line", RESUME, damaged(lambda run: (run / "metrics.jsonl").write_text("[1]\n[2]\n")),
         "metrics.jsonl"),
    Case("metrics.jsonl binary", RESUME, damaged(lambda run: (run / "metrics.jsonl").write_bytes(b"\xff\xfe\n\x00\n")),
         "metrics.jsonl"),
    Case("resume a file", ["run", "--resume", "{tmp}/afile"], lambda tmp: (tmp / "afile").write_text("x"), "afile"),
    Case("resume with options", [*RESUME, "--lr", "0.1"], damaged(lambda run: None), "--resume"),
]

# ---- plots and outputs -------------------------------------------------------------------------------------
def metrics(records: list | str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / "run").mkdir()
        text = records if isinstance(records, str) else "".join(json.dumps(r) + "\n" for r in records)
        (tmp / "run" / "metrics.jsonl").write_text(text)
    return setup


ROUND = {"round": 1, "eval": {"global": {"exit1": 0.5}}}
OUTPUTS = [
    Case("plot metrics without eval", ["plot", "{tmp}/run"], metrics([{"round": 1}]), "eval"),
    Case("plot metrics eval a list", ["plot", "{tmp}/run"], metrics([{"round": 1, "eval": [1]}]), "eval"),
    Case("plot metrics accuracy a word", ["plot", "{tmp}/run"], metrics([{"round": 1, "eval": {"g": {"exit1": "x"}}}]),
         "exit1"),
    Case("plot no rounds with accuracy", ["plot", "{tmp}/run"], metrics([{"round": 1, "eval": {}}]), "metrics"),
    Case("plot metrics list lines", ["plot", "{tmp}/run"], metrics("[1]\n[2]\n"), "metrics.jsonl"),
    Case("plot run folder missing", ["plot", "{tmp}/none"], None, "none"),
    Case("plot --out a folder", ["plot", "{tmp}/run", "--out", "{tmp}"], metrics([ROUND]), "--out"),
    Case("plot --out unknown format", ["plot", "{tmp}/run", "--out", "{tmp}/c.xyz"], metrics([ROUND]), "xyz"),
    Case("plot --out in a missing folder", ["plot", "{tmp}/run", "--out", "{tmp}/no/c.png"], metrics([ROUND]), "no"),
    Case("plot --out unwritable", ["plot", "{tmp}/run", "--out", "/proc/c.png"], metrics([ROUND]), "/proc"),
    Case("describe --png a folder", ["data", "describe", "--dataset", "digits", "--png", "{tmp}"], None, "--png"),
    Case("describe --png unknown format", ["data", "describe", "--dataset", "digits", "--png", "{tmp}/h.xyz"], None,
         "xyz"),
    Case("describe --png unwritable", ["data", "describe", "--dataset", "digits", "--png", "/proc/h.png"], None,
         "/proc"),
    Case("describe --png in a missing folder", ["data", "describe", "--dataset", "digits", "--png", "{tmp}/no/h.png"],
         None, "no"),
    Case("fetch an unknown dataset", ["data", "fetch", "imagenet", "--dest", "{tmp}/d"], None, "imagenet"),
    Case("fetch dest is a file", ["data", "fetch", "fmnist", "--dest", "{tmp}/f"],
         lambda tmp: (tmp / "f").write_text("x"), "download folder"),
    Case("write-app into a file", ["deploy", "--write-app", "{tmp}/f"], lambda tmp: (tmp / "f").write_text("x"), "f"),
]

CASES = option_cases() + VALUES + FILES + DATA + FOLDERS + OUTPUTS


def test_the_matrix_is_large():
    assert len(CASES) >= 150


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_exit_2_and_nothing_changed(case, tmp_path, capsys, monkeypatch, finished_run):
    DONE[:] = [finished_run]
    monkeypatch.chdir(tmp_path)  # default outputs (results/, runs/) land inside the case's folder
    refused(case, tmp_path, capsys)
