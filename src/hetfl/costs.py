"""The cost model: what a sub-model costs a device, measured (DESIGN.md, "Budgets are physical").

For a model family and a ``SubModel`` spec:

* ``params``: parameters the sub-model holds; ``bytes_down`` / ``bytes_up``: its tensors' storage,
  sent to the client and back each round.
* ``macs``: multiply-accumulates per sample of a forward pass through every exit it holds,
  from PyTorch's own FLOP counter (``torch.utils.flop_counter``: convolutions, linear layers and
  matrix products; FLOPs / 2). Element-wise work (BN, ReLU, pooling, bias adds) is not counted.
* ``train_memory``: bytes one training step needs at ``batch_size``: the tensors autograd saves
  for the backward pass (measured with saved-tensor hooks, each storage counted once, parameters
  excluded) + parameters + gradients + the SGD momentum buffer (``memory``, the rule a client
  also measures its steps by). It is what the step must keep alive, not the allocator's peak.
* ``group_memory``: the same for one step of FeDepth's training of a block group (the group and
  the head path; the frozen prefix keeps nothing), measured by running the client's own step.
* ``width_memory``: the training memory of the full-depth backbone at a width ratio, FeDepth's
  budget of that ratio (Sec. 5.1, "Memory budgets").
* ``latency_ms`` (and its interquartile range ``latency_iqr_ms``): median CPU time of a
  single-sample forward pass (eval mode, no autograd) on one thread, after a warm-up, timed by
  ``torch.utils.benchmark.Timer`` in blocks of back-to-back passes, in turns taken round-robin with
  the other sub-models of the same table (``latencies_ms``, ``cost_rows``).

A client's budget is expressed in these units, and a method fits the largest candidate
sub-model whose cost is within it (``devices.fit_largest``). Measurements run on the CPU with
seeded random inputs and are cached per process.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .trainers.blockwise import feature_shapes, frozen_prefix, group_parameters, group_step
from .models.cache import build_model
from .memory import SavedTensors, parameter_bytes, step_bytes
from .models import ModelFamily
from .models.base import federated_state
from .models.registry import image_input
from .slicing import SubModel

if TYPE_CHECKING:
    from torch.utils.benchmark import Measurement


@dataclass(frozen=True)
class Cost:
    """What one sub-model costs a device."""

    params: int
    macs: int
    bytes_down: int
    bytes_up: int
    train_memory: int
    activation_bytes: int


def count_params(module: nn.Module) -> int:
    """Number of parameters ``module`` holds."""
    return sum(p.numel() for p in module.parameters())


def count_macs(module: nn.Module, input_shape: tuple[int, ...], batch: int = 2, example=image_input) -> int:
    """Multiply-accumulates per sample of one forward pass (FlopCounterMode FLOPs / 2) on ``example`` inputs."""
    module.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(example(batch, input_shape))
    return counter.get_total_flops() // 2 // batch


def saved_activation_bytes(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves for backward in one step (each storage once, parameters excluded)."""
    module.train()
    with SavedTensors(exclude=module.parameters()) as saved:
        loss = sum(F.cross_entropy(z, y) for z in module(x))
    del loss
    return saved.bytes


LATENCY_TURNS = 5  # turns each module is timed in, round-robin with the other modules
# A claim's latencies (``bench/runner._model_costs``): more and longer turns. On a 2-core VM, ScaleFL's global/level-2
# ratio read 1.55-1.81x over seven idle calls at (0.3 s, 5 turns), 1.52-1.66x over fourteen at (1.5 s, 30 turns).
CLAIM_LATENCY = {"seconds": 1.5, "turns": 30}


def latencies_ms(modules: list[nn.Module], input_shape: tuple[int, ...], seconds: float = 0.3,
                 min_repeats: int = 30, example=image_input, turns: int = LATENCY_TURNS) -> list[tuple[float, float]]:
    """Returns one (median, interquartile range) per module: ms of a single-sample forward pass (eval mode, no
    autograd) on one thread, after a warm-up, each module timed for ``seconds`` and ``min_repeats`` passes at least.

    ``torch.utils.benchmark.Timer`` times a module in blocks of back-to-back passes (it sizes the blocks so that
    its own overhead is negligible); median and IQR are over the blocks' per-pass means. A Timer measures one
    module at a time, so the modules are timed in ``turns`` taken round-robin (more while a module
    lacks ``min_repeats`` passes), each module's blocks of every turn pooled: the machine's slow phases fall on
    all of them alike.
    """
    from torch.utils.benchmark import Measurement, Timer  # here: importing it costs every hetfl process ~0.2 s

    x = example(1, input_shape, torch.Generator().manual_seed(0))
    # one thread: a device runs one request on its own, and threads add scheduling noise (Timer restores the count)
    timers = [Timer("module(x)", globals={"module": module.eval(), "x": x}, num_threads=1, description=f"module {i}")
              for i, module in enumerate(modules)]
    timed: list[list[Measurement]] = [[] for _ in modules]
    with torch.no_grad():  # grad mode is per thread, and a Timer runs its statement in this one
        for timer in timers:
            timer.timeit(5)  # warm-up, discarded: allocator, oneDNN primitive caches
        while any(len(done) < turns or _passes(done) < min_repeats for done in timed):
            for timer, done in zip(timers, timed):
                done.append(timer.blocked_autorange(min_run_time=seconds / turns))
    pooled = [Measurement.merge(done)[0] for done in timed]  # one module at a time: merge groups by statement
    return [(m.median * 1e3, m.iqr * 1e3) for m in pooled]


def _passes(measurements: list[Measurement]) -> int:
    """Returns how many forward passes ``measurements`` timed in all."""
    return sum(m.number_per_run * len(m.raw_times) for m in measurements)


def build(family: ModelFamily, spec: SubModel) -> nn.Module:
    """The CPU module of ``spec`` (only the exits it holds)."""
    return build_model(family, spec, seed=0)


@lru_cache(maxsize=512)
def measure(family: ModelFamily, spec: SubModel, batch_size: int = 32, momentum: bool = True) -> Cost:
    """The cost of ``spec`` cut from ``family`` (cached per process)."""
    model = build(family, spec)
    params = count_params(model)
    wire = sum(t.numel() * t.element_size() for t in federated_state(model).values())  # frozen tensors stay home
    activations = saved_activation_bytes(model, *random_batch(family, batch_size))
    trained = [p for p in model.parameters() if p.requires_grad]
    frozen = parameter_bytes(p for p in model.parameters() if not p.requires_grad)  # weights only: no gradient
    return Cost(params=params, macs=count_macs(model, family.input_shape, example=family.example_input),
                bytes_down=wire, bytes_up=wire, activation_bytes=activations,
                train_memory=step_bytes(activations, parameter_bytes(trained), 3 if momentum else 2) + frozen)


def random_batch(family: ModelFamily, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded random inputs (images, or token ids) and labels of the family's shapes (memory depends on shapes only)."""
    g = torch.Generator().manual_seed(0)
    return family.inputs(batch_size, g), torch.randint(0, family.num_classes, (batch_size,), generator=g)


def width_memory(family: ModelFamily, ratio: float, batch_size: int = 32) -> int:
    """Training memory of the full-depth backbone at width ``ratio`` holding only its last exit: FeDepth's
    memory budget of ratio r (Sec. 5.1, "Memory budgets": r = 1/6 affords the 1/6-width model)."""
    plain = family.with_exits((family.arch.num_blocks - 1,))
    return measure(plain, SubModel(depth=family.arch.num_blocks, width=ratio), batch_size).train_memory


@lru_cache(maxsize=4096)
def group_memory(family: ModelFamily, first: int, last: int, batch_size: int = 32, head: str = "skip",
                 models: int = 1) -> int:
    """Bytes one step of FeDepth's training of blocks ``first``..``last`` needs at ``batch_size``, ``models`` models
    at once (m-FeDepth): what autograd saves for the group and the head path (the frozen prefix runs without
    autograd and keeps nothing) + 3 x the trainable parameters (values, gradients, momentum). Measured by running
    the client's own step (``blockwise.group_step``) on seeded random inputs; cached per process."""
    nets = [family.build(seed=m).train() for m in range(models)]
    x, y = random_batch(family, batch_size)
    aux = head == "aux"
    params = [p for net in nets for p in group_parameters(net, (first, last), aux)]
    inputs = [x if first == 0 else frozen_prefix(net, x, first) for net in nets]
    _, saved = group_step(nets, (first, last), inputs, y, aux, feature_shapes(nets[0], x[:2])[-1], params)
    return step_bytes(saved, parameter_bytes(params))


def component_costs(family: ModelFamily, width: float, unit: str) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """(stem, per-block, per-exit) parameters or MACs of the full model at ``width``, from one forward pass.

    A depth-d cut with exit e costs stem + sum(blocks[:d]) + exits[e]: split searches over many
    (depth, width) pairs then need one measurement per width, not one per pair; widths that give
    the same channel counts share one measurement (cached per process).
    """
    key = (family, family.signature(width), unit)
    if key not in _COMPONENTS:
        _COMPONENTS[key] = _measure_components(family, width, unit)
    return _COMPONENTS[key]


_COMPONENTS: dict[tuple, tuple[int, tuple[int, ...], tuple[int, ...]]] = {}


def _measure_components(family: ModelFamily, width: float, unit: str) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    model = family.build(width=width, seed=0)
    if unit == "params":
        per = {name: count_params(m) for name, m in model.named_modules()}
        key = lambda name: per[name]  # noqa: E731
    else:
        model.eval()
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(family.inputs(2))  # 2 samples: batch statistics need more than one
        flops = counter.get_flop_counts()
        key = lambda name: sum(flops.get(f"MultiExitModel.{name}", {}).values()) // 4  # noqa: E731
    return (key("stem"), tuple(key(f"blocks.{b}") for b in range(len(model.blocks))),
            tuple(key(f"exits.{e}") for e in range(len(model.exits))))


def describe_spec(spec: SubModel) -> str:
    """A short label of a sub-model: depth, width and exits."""
    label = f"depth {spec.depth}, width {spec.width:g}"
    return label + (f", exits {','.join(map(str, spec.exits))}" if spec.exits is not None else "")


def cost_rows(family: ModelFamily, specs: dict[str, SubModel], batch_size: int = 32,
              latency: bool = True, timing: dict | None = None) -> list[dict]:
    """One JSON-able dict per sub-model: its label, spec, measured cost and (with ``latency``) its latency, timed by
    ``latencies_ms`` with ``timing`` (its ``seconds`` and ``turns``; ``CLAIM_LATENCY`` for a claim)."""
    rows = [{"label": label, "spec": spec.to_dict(), **asdict(measure(family, spec, batch_size)),
             "latency_ms": None, "latency_iqr_ms": None} for label, spec in specs.items()]
    if latency:
        timed = latencies_ms([build(family, spec) for spec in specs.values()], family.input_shape,
                             example=family.example_input, **(timing or {}))
        for row, (median, iqr) in zip(rows, timed):
            row["latency_ms"], row["latency_iqr_ms"] = median, iqr
    return rows


def cost_table(rows: list[dict], full: dict | None = None) -> str:
    """A text table of ``cost_rows`` (ratios against ``full``, default the last row)."""
    from .report import format_table

    full = full or rows[-1]
    header = ["sub-model", "params", "MACs", "MACs ratio", "MB down", "MB up", "train MB", "latency ms (IQR)"]
    body = [[r["label"], f"{r['params']:,}", f"{r['macs'] / 1e6:,.2f}M", f"{r['macs'] / full['macs']:.3f}",
             f"{r['bytes_down'] / 1e6:.2f}", f"{r['bytes_up'] / 1e6:.2f}", f"{r['train_memory'] / 1e6:.1f}",
             "-" if r["latency_ms"] is None else f"{r['latency_ms']:.3f} ({r['latency_iqr_ms']:.3f})"] for r in rows]
    return format_table(header, body)
