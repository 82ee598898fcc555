"""InclusiveFL (Liu et al., KDD 2022): depth-scaled sub-global models, layer-wise heterogeneous
aggregation and momentum distillation (Sec. 3, Algorithm 1).

The global state holds the largest model theta^c with its head (shared names) and, for every
smaller level j, its isolated module f^j: its top block (layer L_j) and its head, under the name
group ``level{j}/``. A level-j client trains theta^c[:L_j - 1] o f^j on the last exit only (CE).

Server, per round (Alg. 1):

* lines 9-14 - homomorphic aggregation: per level, the mean update g^j = mean_i(w_i) - w^j over
  the level's clients (uniform weights, line 14);
* lines 15-18 - momentum distillation: g^{j,L_j} <- beta m^k_{t-1} + (1 - beta) g^{j,L_j}, k the
  next larger level; m^k_{t-1} is zero (line 1: m_0 <- 0) in the first round and when level k had
  no client in the previous round (as the ReeFL authors' port does);
* line 19 - the server optimizer per level (FedAdam by default), with per-level state;
* lines 20-22 - m^j_t = mean of g^{j,l} over layers l = L^-..L_j (L^- = depth of the next smaller
  level), averaged per tensor across those blocks; the mean is accumulated over every layer (the
  authors' code overwrites it and keeps one layer, a bug not copied);
* lines 25-29 - heterogeneous aggregation: every shared layer of theta^c becomes the average of
  the levels that hold it as a shared layer, weighted by their numbers of clients n_j this round
  (line 7: "the number of users for each group"; the authors' code weights by the groups' sample
  shares, which ``aggregation_weights = samples`` gives); isolated modules are taken from their
  own level.

Momentum distillation maps a block's update onto another block, so it needs blocks of identical
shapes (the ViT); for other backbones only "InclusiveFL w/o MD" (md_beta = 0) runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch

from ..aggregation import MaskedMean, ServerState
from ..updates import Update
from ..errors import HetflError
from ..options import Range, opt
from ..slicing import State, SubModel, corner, extract
from .base import Method
from .options import NoOptions

BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class Options(NoOptions):
    """Momentum distillation (Alg. 1 lines 15-23)."""

    md_beta: float = opt(0.0, "InclusiveFL momentum-distillation factor beta in [0, 1] (0 = w/o MD)",
                         valid=Range(0, 1))


@dataclass(frozen=True)
class OptionsWithoutMD(Options):
    """beta = 0: no momentum distillation."""

    def check(self, cfg) -> None:
        if self.md_beta:
            raise HetflError(f"inclusivefl-womd runs without momentum distillation; drop --md-beta "
                             f"(got {self.md_beta}) or use --method inclusivefl")


class InclusiveFL(Method):
    name = "inclusivefl"
    summary = "depth sub-models with per-level top block and head, momentum distillation, FedAdam (InclusiveFL)"
    scalings = ("depth",)
    Options = Options
    # Sec. 4: transformers (BERT, ViT) whose blocks share one shape, as momentum distillation needs; on images the
    # ViT, on text the pretrained MiniLM (config_from)
    defaults = {"model": "vit", "server_opt": "fedadam", "train_exits": "last", "aggregation_weights": "uniform",
                "md_beta": 0.2}

    def __init__(self, cfg, family, num_levels, device="cpu"):
        super().__init__(cfg, family, num_levels, device)
        if cfg.train_exits != "last":
            raise HetflError("InclusiveFL trains the last exit only; drop --train-exits or set it to last")
        if cfg.server_opt == "feddyn":
            raise HetflError("InclusiveFL runs with --server-opt fedadam (the paper) or fedavg, not feddyn")
        self._check_distinct_depths()
        if self.options.md_beta > 0:
            self._check_identical_blocks()

    def _check_distinct_depths(self) -> None:
        depths = [super(InclusiveFL, self).level_spec(j).depth for j in range(1, self.num_levels + 1)]
        if len(set(depths)) != self.num_levels:
            raise HetflError(f"InclusiveFL needs a different depth per level; {self.num_levels} levels of model "
                             f"'{self.family.name}' get depths {depths}; use fewer levels or other budgets")

    def fit_budgets(self, who=None) -> None:
        """Fit the levels to physical budgets; they must still get different depths."""
        super().fit_budgets(who)
        self._check_distinct_depths()

    def _check_identical_blocks(self) -> None:
        shapes: dict[int, dict[str, torch.Size]] = {}
        for name, t in self.family.build().state_dict().items():
            m = BLOCK.match(name)
            if m:
                shapes.setdefault(int(m.group(1)), {})[m.group(2)] = t.shape
        if len({tuple(sorted(s.items())) for s in shapes.values()}) > 1:
            raise HetflError(f"momentum distillation needs blocks of identical shapes, but model "
                             f"'{self.family.name}' has blocks of different shapes; use --md-beta 0 "
                             "(InclusiveFL w/o MD) or --model vit")

    # ---- sub-global models ------------------------------------------------------------------
    def level_spec(self, level: int) -> SubModel:
        """Level ``level``'s sub-global model: shared bottom blocks, its own top block and head."""
        spec = super().level_spec(level)
        if level == self.num_levels:
            return spec  # theta^c and f^c: all under the shared names
        shared = ("stem.",) + tuple(f"blocks.{b}." for b in range(spec.depth - 1))
        return replace(spec, group=f"level{level}/", shared=shared, level=level)

    def init_state(self, seed: int) -> ServerState:
        """theta^c_0 and every f^j_0 copied from the same initial model (Alg. 1 lines 1-3); m_0 = 0 (no momentum)."""
        full = super().init_state(seed).params
        state = {n: full[n] for n in self.models.shapes(self.level_spec(self.num_levels))}  # theta^c o f^c
        for level in range(1, self.num_levels):
            spec = self.level_spec(level)
            for name, shape in self.models.shapes(spec).items():
                key = spec.global_name(name)
                if key != name:
                    state[key] = full[name][corner(shape)].clone()
        return ServerState(state)

    def plan(self, client, budget, round_index) -> SubModel:
        """The sub-global model of the client's level."""
        return self.level_spec(budget.level)

    def eval_specs(self):
        return self.level_eval_specs()

    # ---- server ---------------------------------------------------------------------------
    def aggregate(self, server: ServerState, updates: Iterable[Update]) -> ServerState:
        """Algorithm 1, lines 8-29; ``server.extra`` holds m^j_{t-1} by "level{j}/{block-parameter suffix}"."""
        global_state, opt = server.params, dict(server.opt)
        groups: dict[int, tuple[SubModel, State, MaskedMean]] = {}
        counts: dict[int, float] = {}
        for update in updates:
            level = self._level_of(update.spec)
            if level not in groups:
                w = extract(global_state, self.models.shapes(update.spec), update.spec)  # w^j_t
                groups[level] = (update.spec, w, MaskedMean(w))
            weight = self.aggregate_weight(update)
            groups[level][2].add(update.state, weight)
            counts[level] = counts.get(level, 0) + weight  # n_j: clients (uniform) or samples
        beta = self.options.md_beta
        new_momentum: State = {}
        sub_global: dict[int, tuple[SubModel, State, int]] = {}
        for level in sorted(groups):
            spec, w, agg = groups[level]
            self.perturb(agg, levels=False)  # differential privacy's noise on the level's sums (``privacy``)
            g = {name: mean - w[name] for name, (mean, _) in agg.mean().items()}  # line 14
            top = spec.depth - 1
            if beta > 0 and level < self.num_levels:  # lines 15-18, m = 0 where level + 1 has none yet
                m = self._momentum_of(server.extra, level + 1)
                prefix = f"blocks.{top}."
                for name in [n for n in g if n.startswith(prefix)]:
                    g[name] = beta * m.get(name[len(prefix):], 0.0) + (1 - beta) * g[name]
            new_w = {name: self.server.apply(opt, f"level{level}/{name}", w[name], w[name] + g[name],
                                             torch.ones_like(w[name], dtype=torch.bool), None)
                     for name in w}  # line 19
            if beta > 0 and level > 1:  # lines 20-22
                lower = self.depth_for_level(level - 1)
                new_momentum.update(self._mean_block_update(g, range(lower - 1, top + 1), level))
            sub_global[level] = (spec, new_w, counts[level])
        return ServerState(self._heterogeneous_aggregation(global_state, sub_global), opt, new_momentum)

    def _level_of(self, spec: SubModel) -> int:
        return spec.level or self.num_levels

    @staticmethod
    def _momentum_of(momentum: State, level: int) -> State:
        """m^level_{t-1} per block-parameter suffix (empty when that level had no client)."""
        prefix = f"level{level}/"
        return {k[len(prefix):]: v for k, v in momentum.items() if k.startswith(prefix)}

    @staticmethod
    def _mean_block_update(g: State, blocks: range, level: int) -> State:
        """m^level_t: per suffix, the mean of g over ``blocks`` (Alg. 1 line 22)."""
        sums: dict[str, torch.Tensor] = {}
        for name, delta in g.items():
            m = BLOCK.match(name)
            if m and int(m.group(1)) in blocks:
                sums[m.group(2)] = sums.get(m.group(2), 0) + delta
        return {f"level{level}/{suffix}": total / len(blocks) for suffix, total in sums.items()}

    def _heterogeneous_aggregation(self, global_state: State,
                                   sub_global: dict[int, tuple[SubModel, State, int]]) -> State:
        """Shared layers: n_j-weighted mean over the levels holding them; isolated ones: their own level's."""
        new = dict(global_state)
        sums: State = {}
        weights: dict[str, int] = {}
        for spec, w, n in sub_global.values():
            for name, value in w.items():
                key = spec.global_name(name)
                if spec.group and key != name:  # isolated module f^j (lines 28-29)
                    new[key] = value
                else:  # shared layer of theta^c (lines 26-27)
                    sums[key] = sums.get(key, 0) + n * value
                    weights[key] = weights.get(key, 0) + n
        for key, total in sums.items():
            new[key] = total / weights[key]
        return new


class InclusiveFLWithoutMD(InclusiveFL):
    name = "inclusivefl-womd"
    summary = "InclusiveFL without momentum distillation (md_beta = 0)"
    defaults = {**InclusiveFL.defaults, "md_beta": 0.0}

    Options = OptionsWithoutMD
