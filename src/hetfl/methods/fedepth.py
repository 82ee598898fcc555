"""FeDepth and m-FeDepth (Zhang et al., "Memory-adaptive Depth-wise Heterogeneous Federated Learning", 2023).

Every client trains the FULL model, block group by block group, each group's step within its
measured memory budget. Algorithm 1 as hetfl runs it:

* Sec. 5.1, "Memory budgets" - a budget of ratio r is the measured training memory of the
  full-depth model at width r (``--budget width-memory``; Fair r = 1/6, 1/3, 1/2, 1 by default,
  Surplus 1/6, 1/3, 1/2, 2), drawn by the scenario for every client (uniformly with equal
  proportions).
* lines 2-3 - the sampled clients receive the whole global model W^t                  -> ``plan``
* Sec. 4, Fig. 3 - memory-adaptive decomposition, per client from its own budget: consecutive
  blocks are grouped greedily from the input side while the measured memory of a step of the
  group fits (``costs.group_memory``: the group's and the head path's saved activations, the
  frozen prefix keeping nothing, + its parameters, gradients and momentum); a block that does not
  fit even alone is never trained by that client (Sec. "Handle extreme memory constraints":
  partial training). A client whose budget trains no block at all sits its rounds out, with a
  warning (the paper is silent; partial training taken to its end), unless no budget trains any.
  Planned on the server, which holds the cost model, and sent in the client's task
  (``task.Blockwise``)                                                      -> ``decompose``, ``schedule``
* lines 9-15, problem (1) - depth-wise sequential learning on the client with the skip connection
  of Fig. 4 or auxiliary classifiers (``fedepth_head``); every group runs the full local budget
  of steps; the frozen prefix's output optionally buffered (``buffer_prefix``)
                                                                  -> ``blockwise`` (the client side)
* line 7 - aggregation: the sample-weighted average, each tensor over the clients that trained it
  (a client uploads the blocks it trained, so a block left out by partial training is averaged
  over the clients with the memory for it, as Sec. "Handle extreme memory constraints" says)
                                                                                 -> ``Method.aggregate``
* inference - the global model's head (the last exit).

m-FeDepth (Sec. "Exploit sufficient memory with mutual knowledge distillation"): a client whose
budget affords M >= 2 models trains them together with deep mutual learning and uploads one. The
paper does not say when a budget "affords" M models; its Table 2 does: m-FeDepth differs from
FeDepth under Fair and Lack budgets (by up to 5 points on CIFAR-100), where no client fits two
models in FeDepth's own groups, so its rich clients must train M models in finer groups. hetfl's
default (``mutual_plan = models``) reads it so: the largest M (up to ``mutual_models``) whose
greedy decomposition of M models' step costs trains every block that one model's does, with those
finer groups (Fair r = 1/2 and 1 train two models, block pairs instead of longer groups).
``mutual_plan = depth`` keeps FeDepth's groups and adds models only where M copies of each fit
(Surplus r = 2 alone), so that Fair m-FeDepth is FeDepth. Where the other models live between
rounds: ``client._blockwise_update`` (the client's own state on disk).

The paper is silent on BatchNorm; as for every hetfl method, BN uses batch statistics in training
and static statistics of the training data for evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ..costs import group_memory
from ..devices import Budget, describe_budget
from ..errors import HetflError, warn
from ..options import Range, opt
from ..slicing import SubModel
from ..task import BLOCKWISE_HEADS, Blockwise
from .base import Method
from .options import NoOptions

Group = tuple[int, int]  # (first, last) blocks, 0-based, inclusive


def decompose(num_blocks: int, cost: Callable[[int, int], float], budget: float) -> tuple[Group, ...]:
    """Fig. 3: the groups (first, last) of consecutive blocks, grown greedily from the input side while
    ``cost(first, last)`` fits ``budget``; a block whose cost alone exceeds the budget is in no group."""
    groups, first = [], 0
    while first < num_blocks:
        if cost(first, first) > budget:  # partial training: this block is never trained here
            first += 1
            continue
        last = first
        while last + 1 < num_blocks and cost(first, last + 1) <= budget:
            last += 1
        groups.append((first, last))
        first = last + 1
    return tuple(groups)


@dataclass(frozen=True)
class Options(NoOptions):
    """How a group reaches a classifier, and buffering of the frozen prefix."""

    fedepth_head: str = opt("skip", "FeDepth: a block group reaches the classifier by the parameter-free skip "
                            "connection to the model's head (skip) or by an auxiliary classifier after every "
                            "block (aux)", BLOCKWISE_HEADS)
    buffer_prefix: bool = opt(False, "FeDepth: keep the frozen prefix's output of every local sample while a group "
                              "trains, where the budget affords it (Sec. 4); not with augmentation")

    def check(self, cfg) -> None:
        if cfg.budget not in ("width-memory", "memory"):
            raise HetflError(f"FeDepth decomposes the model by measured training memory: use --budget width-memory "
                             f"(the paper's budgets) or memory, not '{cfg.budget}'")
        if cfg.server_opt == "feddyn":
            raise HetflError("FeDepth trains with --server-opt fedavg (Alg. 1) or fedadam, not feddyn")
        if cfg.exits:
            raise HetflError("FeDepth places its own exits (the head; with --fedepth-head aux, one after every "
                             "block); drop --exits")
        if self.buffer_prefix and (cfg.crop_padding or cfg.flip):
            raise HetflError("buffer_prefix keeps the prefix's output of un-augmented samples; drop it or turn off "
                             "--crop-padding and --flip")


class FeDepth(Method):
    name = "fedepth"
    summary = "every client trains the full model block group by block group within its measured memory (FeDepth)"
    Options = Options
    scalings = ("depth",)
    # Sec. 5.1: PreResNet-20 and the Fair budgets; the default CNN's first block alone outgrows the r = 1/6 budget
    defaults = {"model": "preresnet20", "budget": "width-memory", "budget_ratios": [1 / 6, 1 / 3, 1 / 2, 1.0]}

    def __init__(self, cfg, family, num_levels, device="cpu"):
        super().__init__(cfg, family, num_levels, device)
        self._schedules: dict[Budget, Blockwise] = {}
        with torch.no_grad():
            between = self.models.module(self.full_spec()).stem(family.inputs(2).to(self.device))
        if not isinstance(between, torch.Tensor):  # MSDNet's blocks pass one map per scale
            raise HetflError(f"FeDepth's skip connection and block groups read one feature map between blocks; model "
                             f"'{family.name}' passes {len(between)} scales between its blocks: use a single-scale "
                             "backbone (preresnet20, cnn, resnet18/34, resnet110)")

    @classmethod
    def make_family(cls, cfg, input_shape, num_classes):
        """The backbone with its head only, or with an auxiliary classifier after every block (``fedepth_head``)."""
        family = super().make_family(cfg, input_shape, num_classes)
        n = family.arch.num_blocks
        aux = cfg.method_options.get("fedepth_head", Options.fedepth_head) == "aux"
        return family.with_exits(tuple(range(n)) if aux else (n - 1,))

    @property
    def aux(self) -> bool:
        """Whether groups train auxiliary classifiers rather than the shared head."""
        return self.options.fedepth_head == "aux"

    def candidates(self) -> list[SubModel]:
        """The full model: every client trains all of it."""
        return [self.full_spec()]

    def fit(self, budget: Budget) -> SubModel | None:
        """The full model, or None (the client sits out) where the budget trains no block."""
        return None if self.schedule(budget) is None else self.full_spec()

    def use_budgets(self, level_budgets, cost) -> None:
        """The levels' budgets, once checked that at least one trains a block (the others' clients sit out)."""
        if not any(self.groups_within(b.memory_bytes) for b in level_budgets):
            smallest = min(self.group_cost(b, b) for b in range(self.family.arch.num_blocks))
            largest = max(level_budgets, key=lambda b: b.memory_bytes)
            raise HetflError(f"no budget trains a block of {self.family.name}: the largest is "
                             f"{describe_budget(largest)} and the smallest block needs {smallest / 2**20:.2f} MiB; "
                             f"raise --budget-ratios or lower --batch-size")
        super().use_budgets(level_budgets, cost)

    def plan(self, client, budget, round_index) -> SubModel | None:
        """Alg. 1 line 3: the whole global model (None: the client's budget trains no block, it sits out)."""
        return self.fit(budget)

    def configure(self, state, client, budget, round_index):
        """The task of training the whole model block-wise, with the client's decomposition (Fig. 3); None where the
        client sits out."""
        configured = super().configure(state, client, budget, round_index)
        if configured is None:
            return None
        task, local = configured
        return replace(task, trainer="blockwise", blockwise=self.schedule(budget)), local

    # ---- the decomposition --------------------------------------------------------------------
    def group_cost(self, first: int, last: int, models: int = 1) -> int:
        """Measured bytes of one step of training blocks first..last with ``models`` models at the batch size."""
        return group_memory(self.family, first, last, self.cfg.batch_size, self.options.fedepth_head, models)

    def schedule(self, budget: Budget) -> Blockwise | None:
        """The plan of a client with ``budget``: its groups (Fig. 3), its number of models, the planned bytes;
        None where the budget trains no block (warned once per budget)."""
        if budget not in self._schedules:
            limit = budget.memory_bytes
            groups = self.groups_within(limit)
            if not groups:
                smallest = min(self.group_cost(b, b) for b in range(self.family.arch.num_blocks))
                warn(f"a budget of {describe_budget(budget)} trains no block of {self.family.name} (the smallest "
                     f"needs {smallest / 2**20:.2f} MiB): its clients sit out")
                self._schedules[budget] = None
                return None
            groups, models = self.models_for(groups, limit)
            self._schedules[budget] = Blockwise(
                groups=groups, head=self.options.fedepth_head, models=models, budget_bytes=limit,
                group_bytes=tuple(self.group_cost(f, l, models) for f, l in groups), buffer=self.options.buffer_prefix)
        return self._schedules[budget]

    def groups_within(self, limit: int, models: int = 1) -> tuple[Group, ...]:
        """Fig. 3's greedy groups of ``models`` models' step costs within ``limit`` bytes."""
        return decompose(self.family.arch.num_blocks, lambda f, l: self.group_cost(f, l, models), limit)

    def models_for(self, groups: tuple[Group, ...], limit: int) -> tuple[tuple[Group, ...], int]:
        """The groups a client trains and how many models it trains in them: one model's groups, 1 (FeDepth)."""
        return groups, 1

    def budget_report(self) -> dict:
        """The per-block memory (each block trained alone) and every level's decomposition, as Table 1 and the
        B1 -> B2 -> ... example of Sec. 5.1."""
        n = self.family.arch.num_blocks
        mib = lambda b: f"{b / 2**20:.2f}"  # noqa: E731
        blocks = [[f"B{b + 1}", mib(self.group_cost(b, b)), mib(self.group_cost(b, b + 1)) if b + 1 < n else "-"]
                  for b in range(n)]
        levels = []
        for level, budget in enumerate(self.level_budgets or [], start=1):
            plan = self.schedule(budget)
            if plan is None:
                levels.append([f"level {level}", mib(budget.memory_bytes), "sits out", "all", "0", "-"])
                continue
            trained = _blocks(plan.groups)
            levels.append([f"level {level}", mib(budget.memory_bytes), " -> ".join(map(_group_label, plan.groups)),
                           ",".join(f"B{b + 1}" for b in range(n) if b not in trained) or "-", str(plan.models),
                           f"{max(plan.group_bytes) / budget.memory_bytes:.3f}"])
        return {"per block (each block trained alone, the head path included; Table 1)":
                {"header": ["block", "train MiB alone", "train MiB with the next"], "rows": blocks},
                "decomposition per budget (Fig. 3, Sec. 5.1)":
                {"header": ["budget", "MiB", "decomposition", "never trained", "models", "largest step / budget"],
                 "rows": levels}}


def _blocks(groups: tuple[Group, ...]) -> set[int]:
    """The blocks that ``groups`` train."""
    return {b for f, l in groups for b in range(f, l + 1)}


def _group_label(group: Group) -> str:
    """B1, or B5,6 (1-based blocks, the paper's notation)."""
    first, last = group
    return "B" + ",".join(str(b + 1) for b in range(first, last + 1))


@dataclass(frozen=True)
class MutualOptions(Options):
    """FeDepth's options, and the most models an m-FeDepth client trains together."""

    mutual_models: int = opt(2, "m-FeDepth: the most models a client trains together by deep mutual learning, "
                             "where its budget affords them (>= 2)", valid=Range(2, 16))
    mutual_plan: str = opt("models", "m-FeDepth: where a budget affords M models: in finer groups that still train "
                           "every block one model's groups train (models), or only where M copies of FeDepth's own "
                           "groups fit (depth)", ("models", "depth"), added_later=True)

    def check(self, cfg) -> None:
        super().check(cfg)


class MFeDepth(FeDepth):
    name = "m-fedepth"
    summary = "FeDepth where clients with spare memory train M models by deep mutual learning, uploading one"
    Options = MutualOptions

    def models_for(self, groups: tuple[Group, ...], limit: int) -> tuple[tuple[Group, ...], int]:
        """The most models (up to ``mutual_models``) the budget affords, and their groups (``mutual_plan``):
        ``models`` - the greedy groups of M models' costs, if they train every block of one model's ``groups``;
        ``depth`` - ``groups`` themselves, if M copies of every one fit ``limit``."""
        trained = _blocks(groups)
        for m in range(self.options.mutual_models, 1, -1):
            if self.options.mutual_plan == "depth":
                if all(self.group_cost(f, l, m) <= limit for f, l in groups):
                    return groups, m
            elif _blocks(finer := self.groups_within(limit, m)) == trained:
                return finer, m
        return groups, 1

    @property
    def stateful_clients(self) -> bool:
        """Whether some budget affords several models: the others live in their client's own state between rounds."""
        return any((plan := self.schedule(b)) is not None and plan.models > 1 for b in self.level_budgets or [])
