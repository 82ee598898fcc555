"""Property tests of the input contract: whatever values, TOML documents or flags a user gives, hetfl
either accepts a config whose every value is usable, or refuses with one line (HetflError; the CLI: exit 2) and
creates nothing. Seeded (derandomized) so that CI runs the same examples every time."""

from __future__ import annotations

import math
import pickle
from dataclasses import fields

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetfl.cli import main, method_option_fields
from hetfl.config import Config
from hetfl.errors import HetflError
from hetfl.methods import METHODS, config_from, load_config, method_class, option_owners
from hetfl.options import FLOAT32_MAX, INT64_MAX

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
NAMES = Config.field_names() + list(method_option_fields())

scalars = st.one_of(
    st.integers(min_value=-2 ** 70, max_value=2 ** 70), st.integers(min_value=-3, max_value=40),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(min_value=-2, max_value=2), st.booleans(),
    st.text(max_size=8), st.sampled_from(["digits", "depthfl", "nan", "inf", "1e400", "0", "-1", "1,2", "true", ""]),
)
values = st.one_of(scalars, st.lists(scalars, max_size=4), st.dictionaries(st.text(max_size=3), scalars, max_size=2))
method_names = st.sampled_from(list(METHODS))


@st.composite
def option_values(draw) -> dict:
    """A few options (generic, a method's, or unknown) with values of any type, for a method drawn at random."""
    keys = draw(st.lists(st.one_of(st.sampled_from(NAMES), st.text(min_size=1, max_size=6)), max_size=2, unique=True))
    options = {key: draw(values) for key in keys}
    options.setdefault("method", draw(method_names))
    return options


def assert_usable(cfg: Config) -> None:
    """Every option of ``cfg`` has its declared type and a usable value."""
    for f in fields(Config):
        value = getattr(cfg, f.name)
        kind = f.type
        items = value if kind.startswith("list") else [value]
        for item in items:
            if "float" in kind:
                assert type(item) is float and math.isfinite(item) and abs(item) <= FLOAT32_MAX, (f.name, item)
            elif "int" in kind:
                assert type(item) is int and abs(item) <= INT64_MAX, (f.name, item)
            elif kind == "bool":
                assert type(item) is bool, (f.name, item)
            elif kind == "str":
                assert type(item) is str, (f.name, item)
        valid = f.metadata.get("range")
        if valid is not None:
            assert all(valid.holds(item) for item in items), (f.name, value)
    method_class(cfg.method).options_of(cfg)  # the method's own options pass its checks too


def accepted_or_one_line(make) -> Config | None:
    """``make()``'s config after checking it is usable, or None after checking its refusal is one HetflError line."""
    try:
        cfg = make()
    except HetflError as e:
        assert str(e) and "\n" not in str(e)
        return None
    assert_usable(cfg)
    return cfg


@settings(max_examples=300, **SETTINGS)
@given(option_values())
def test_any_option_values_give_a_usable_config_or_one_line(options):
    accepted_or_one_line(lambda: config_from(options, source="test").validate())


OWNER = {name: methods[0] for name, methods in option_owners().items()}  # a method that takes the option


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=15, **SETTINGS)
@given(value=values)
def test_any_value_of_each_option_gives_a_usable_config_or_one_line(name, value):
    options = {name: value, **({"method": OWNER[name]} if name in OWNER and name != "method" else {})}
    accepted_or_one_line(lambda: config_from(options, source="test").validate())


def toml_value(value) -> str:
    """``value`` as TOML (scalars, arrays, inline tables), written the way a user would."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.encode("unicode_escape").decode().replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{toml_value(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


@settings(max_examples=200, **SETTINGS)
@given(option_values(), st.one_of(st.none(), st.binary(max_size=40)))
def test_any_toml_document_gives_a_usable_config_or_one_line(tmp_path, options, garbage):
    path = tmp_path / "c.toml"
    text = "".join(f'"{k}" = {toml_value(v)}\n' for k, v in options.items() if "\\" not in k and '"' not in k)
    path.write_bytes(text.encode() + (garbage or b""))  # garbage: mostly not TOML, or not UTF-8: refused whole
    accepted_or_one_line(lambda: load_config(path).validate())


flag_values = st.one_of(st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1", "0.5", "2", "1e400", "3.5", "abc",
                                         "1,2", "", "true", str(2 ** 70), "digits", "depthfl", "-0"]),
                        st.floats(allow_nan=True).map(repr), st.integers(-5, 5).map(str))


class Accepted(Exception):
    """What the test's stand-in for ``Simulation.run`` raises: the run was set up, every check passed."""


@pytest.mark.parametrize("command", ["run"])
@settings(max_examples=120, **SETTINGS)
@given(flags=st.lists(st.tuples(st.sampled_from(NAMES), flag_values), max_size=3, unique_by=lambda kv: kv[0]))
def test_any_flags_exit_2_with_one_line_and_nothing_created(command, flags, tmp_path_factory, monkeypatch, capsys):
    from hetfl import sim

    def accepted(self, *args, **kwargs):
        assert_usable(self.cfg)
        raise Accepted

    monkeypatch.setattr(sim.Simulation, "run", accepted)
    out = tmp_path_factory.mktemp("out")
    argv = [command, "--quiet", "--dataset", "digits", "--num-clients", "4", "--client-fraction", "0.5",
            "--model-width", "0.25", "--out", str(out / "runs")]
    for name, value in flags:
        argv += [f"--{name.replace('_', '-')}={value}"]
    try:
        code = main(argv)
    except Accepted:
        return
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("hetfl: error: "), (argv, err)
    assert not any(out.iterdir()), argv


# ---- CIFAR batch files: any arrays-only pickle ----------------------------------------------------------------
numbers = st.one_of(st.integers(min_value=-2 ** 70, max_value=2 ** 70), st.integers(0, 300),
                    st.floats(allow_nan=True, allow_infinity=True), st.booleans())
leaves = st.one_of(numbers, st.text(max_size=3), st.binary(max_size=3), st.none())
pixel_dtypes = st.sampled_from([np.uint8, np.int16, np.int64, np.uint64, np.float32, np.float64, np.bool_, "U2",
                                object])


@st.composite
def numpy_arrays(draw) -> np.ndarray:
    """A small array of any kind: a right-width image block or not, of numbers, words or objects."""
    rows = draw(st.integers(0, 3))
    shape = draw(st.sampled_from([(rows, 3072), (rows,), (rows, 7), (rows, 3072, 1), ()]))
    dtype = draw(pixel_dtypes)
    fill = draw(st.one_of(st.integers(-3, 300), st.floats(allow_nan=True, allow_infinity=True), st.just("a")))
    try:
        with np.errstate(all="ignore"):  # a NaN or 300 cast to uint8 is the point, not a problem
            return np.full(shape, fill, dtype=dtype)
    except (ValueError, TypeError, OverflowError):
        return np.zeros(shape, dtype=dtype)


contents = st.recursive(st.one_of(leaves, numpy_arrays()),
                        lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                                                st.dictionaries(st.sampled_from([b"data", b"labels", "data", 1]),
                                                                inner, max_size=3)), max_leaves=8)
batches = st.one_of(contents, st.fixed_dictionaries({b"data": contents, b"labels": contents}),
                    st.fixed_dictionaries({b"data": numpy_arrays(), b"labels": st.one_of(numpy_arrays(), contents)}))


@settings(max_examples=150, **SETTINGS)
@given(batch=batches, protocol=st.sampled_from([2, 4, 5]))
def test_any_cifar_batch_content_loads_or_gives_one_line(tmp_path_factory, batch, protocol):
    """A CIFAR batch file holding any pickle of arrays and plain containers: a loaded dataset or HetflError, never
    another exception."""
    from hetfl.data import datasets

    folder = tmp_path_factory.mktemp("cifar") / "cifar-10-batches-py"
    folder.mkdir()
    good = pickle.dumps({b"data": np.zeros((4, 3072), np.uint8), b"labels": [0, 1, 2, 3]})
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (folder / name).write_bytes(good)
    (folder / "data_batch_2").write_bytes(pickle.dumps(batch, protocol=protocol))
    try:
        dataset = datasets.load_dataset("cifar10", str(folder.parent))
    except HetflError as e:
        assert "\n" not in str(e) and "data_batch_2" in str(e), str(e)
        return
    assert dataset.x_train.shape[1:] == (3, 32, 32) and dataset.y_train.dtype == torch.int64
