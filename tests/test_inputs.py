"""Bad input that used to slip through or crash: one line, exit code 2, nothing written."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from hetfl.cli import main

TINY = ["--dataset", "digits", "--num-clients", "20", "--rounds", "1", "--model-width", "0.25", "--quiet"]


def one_line_error(capsys, args) -> str:
    """The one stderr line of ``hetfl ARGS``, after checking it exited 2 with that line alone."""
    code = main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("hetfl: error: "), err
    return err


# ---- 8. --out and --name --------------------------------------------------------------------------------
def test_out_naming_an_existing_file(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    for out in (afile, afile / "runs"):
        err = one_line_error(capsys, ["run", *TINY, "--out", str(out)])
        assert f"{afile} is a file, not a folder" in err
    assert afile.read_text() == "not a folder"


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ".", "/abs"])
def test_name_is_one_path_component(tmp_path, capsys, name):
    out = tmp_path / "deep" / "er" / "runs"
    err = one_line_error(capsys, ["run", *TINY, "--out", str(out), "--name", name])
    assert "must be a single folder name" in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == []  # nothing written, inside --out or out of it


# ---- 9. data validation -----------------------------------------------------------------------------------
def idx_bytes(a: np.ndarray, magic: bytes | None = None) -> bytes:
    header = magic or bytes([0, 0, 0x08, a.ndim])
    return header + struct.pack(f">{a.ndim}I", *a.shape) + a.astype(np.uint8).tobytes()


def idx_folder(folder: Path, y_train: np.ndarray, y_test: np.ndarray, label_magic: bytes | None = None) -> Path:
    """An MNIST-style folder of random 8x8 images (as digits: the CNN takes them) with these labels."""
    names = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
    rng = np.random.default_rng(0)
    arrays = (rng.integers(0, 256, (len(y_train), 8, 8)), y_train, rng.integers(0, 256, (len(y_test), 8, 8)), y_test)
    folder.mkdir(parents=True)
    for name, a in zip(names, arrays):
        (folder / name).write_bytes(idx_bytes(a, label_magic if "labels" in name else None))
    return folder


def test_stray_idx_label_is_an_error_not_a_201_class_model(tmp_path, capsys):
    y = np.arange(40) % 10
    y[7] = 200
    data = idx_folder(tmp_path / "data", y, np.arange(20) % 10)
    err = one_line_error(capsys, ["run", *TINY, "--dataset", f"idx:{data}", "--out", str(tmp_path / "runs")])
    assert "classes 10..199 of 0..200 have no sample; label 200 looks out of range" in err
    assert not (tmp_path / "runs").exists()


def test_test_classes_absent_from_training_are_a_warning(tmp_path, capsys):
    from hetfl.data import load_dataset

    data = idx_folder(tmp_path / "data", np.arange(40) % 8, np.arange(20) % 10)  # classes 8, 9 only in test
    ds = load_dataset(f"idx:{data}")
    assert ds.num_classes == 10
    err = capsys.readouterr().err
    assert "hetfl: warning: " in err and "test classes 8..9 have no training sample" in err


@pytest.mark.parametrize("where", ["x_train", "x_test"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_inputs_are_an_error(tmp_path, capsys, where, bad):
    rng = np.random.default_rng(1)
    arrays = {"x_train": rng.random((30, 4, 4)), "y_train": np.arange(30) % 3,
              "x_test": rng.random((9, 4, 4)), "y_test": np.arange(9) % 3}
    arrays[where][2, 1, 1] = bad
    np.savez(tmp_path / "d.npz", **arrays)
    err = one_line_error(capsys, ["run", *TINY, "--dataset", f"npz:{tmp_path / 'd.npz'}",
                                  "--out", str(tmp_path / "runs")])
    assert f"{where} holds 1 non-finite values" in err
    assert not (tmp_path / "runs").exists()


def test_all_nan_npz_is_an_error(tmp_path, capsys):
    x = np.full((20, 4, 4), np.nan)
    np.savez(tmp_path / "nan.npz", x_train=x, y_train=np.arange(20) % 10, x_test=x[:5], y_test=np.arange(5))
    err = one_line_error(capsys, ["run", *TINY, "--dataset", f"npz:{tmp_path / 'nan.npz'}",
                                  "--out", str(tmp_path / "runs")])
    assert "x_train holds 320 non-finite values" in err


# ---- 10. error text ----------------------------------------------------------------------------------------
def test_no_doubled_prefix(capsys):
    assert one_line_error(capsys, ["run", "--colour", "red"]) == "hetfl: error: unrecognized arguments: --colour red"
    assert one_line_error(capsys, []) == "hetfl: error: the following arguments are required: command"
    assert one_line_error(capsys, ["run", "--rounds"]) == "hetfl: error: run: argument --rounds: expected one argument"


@pytest.mark.parametrize("flags,fragment", [
    (["--proportions", "-1,2,7", "--levels", "3"], "proportions must be >= 0, got [-1.0, 2.0, 7.0]"),
    (["--rounds", "-3"], "rounds must be an integer >= 1, got -3"),
    (["--lr", "-1e-3"], "lr must be > 0, got -0.001"),
    (["--alpha", "-.5"], "alpha must be > 0, got -0.5"),
])
def test_negative_values_get_the_real_reason(tmp_path, capsys, flags, fragment):
    err = one_line_error(capsys, ["run", *TINY, "--out", str(tmp_path / "runs"), *flags])
    assert fragment in err


@pytest.mark.parametrize("magic,fragment", [
    (bytes([0, 0, 0x08, 0x03]), "its last byte says 3 dimensions, expected 1"),  # an images magic on a labels file
    (bytes([0, 0, 0x08, 0x00]), "its last byte says 0 dimensions"),
    (bytes([0, 0, 0x0D, 0x01]), "type code 0x0d does not fit the file's size, type code 0x08 would"),
])
def test_bad_idx_magic_is_reported_as_a_bad_magic_number(tmp_path, capsys, magic, fragment):
    data = idx_folder(tmp_path / "data", np.arange(40) % 10, np.arange(20) % 10, label_magic=magic)
    err = one_line_error(capsys, ["run", *TINY, "--dataset", f"idx:{data}", "--out", str(tmp_path / "runs")])
    assert "bad IDX magic number" in err and fragment in err and "train-labels-idx1-ubyte" in err
