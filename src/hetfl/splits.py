"""ScaleFL's 2-D split search (Ilhan et al., CVPR 2023, Sec. 3.1.1, Eq. (1) and Alg. 1 lines 2-5).

For level l with target cost ratio r_l and tolerance epsilon_l, the split (s_d, s_w) minimises
|s_d - s_w| subject to |cost(split(M; s_d, s_w)) / (r_l cost(M)) - 1| <= epsilon_l. Levels are
searched in order and each adds its exit to M after block floor(s_d N) (Alg. 1 line 4), so:

* the split's cost is that of the model a level-l client trains: the first floor(s_d N) blocks at
  width s_w, the exits earlier levels placed below that depth, and its own exit at the cut;
* cost(M) is M as it stands when level l is searched: the full network with the exits placed so
  far and its classifier; the last level (r_L = 1) is M itself, exactly 1;
* with ``nested`` (hetfl's default) levels are kept nested: a level cuts at least as deep as the
  one before and is at least as wide, so every level's model contains the smaller ones' (the
  hierarchy of the paper's Fig. 2); two levels that cut at the same block share the exit there
  (possible on shallow backbones such as the 4-block CNN). Eq. (1) itself states no such
  constraint: without ``nested`` each level takes the unconstrained argmin, which can be feasible
  where the nested one is not (the ViT's level 3), at the price of a level whose model is
  shallower or narrower than a smaller level's. Eq. (2)'s element-wise mean handles either.

Cost is parameters (as the paper's Table 1, whose r_l are parameter ratios) or MACs per sample,
measured by ``costs.component_costs``. Widths are searched on the grid 0.01..1.00; s_d = d / N.
The authors' code hard-codes the splits instead; hetfl searches.
"""

from __future__ import annotations

from dataclasses import dataclass

from .costs import component_costs
from .errors import HetflError
from .models import ModelFamily

WIDTH_GRID = tuple(k / 100 for k in range(1, 101))


@dataclass(frozen=True)
class Split:
    """One level's 2-D split: target ratio, depth and width ratios, blocks kept, achieved cost ratio."""

    level: int
    target: float
    epsilon: float
    s_d: float
    s_w: float
    depth: int
    ratio: float

    @property
    def within_epsilon(self) -> bool:
        """Whether the achieved ratio meets the target within the tolerance (Eq. (1)'s constraint)."""
        return abs(self.ratio / self.target - 1) <= self.epsilon + 1e-12


def split_search(family: ModelFamily, targets: list[float], epsilons: list[float], unit: str,
                 nested: bool = True) -> list[Split]:
    """Eq. (1) for every level in order (kept nested, or not); ``family`` must have an exit after every block.

    For one depth the cost grows with the width, so the feasible widths form an interval of the
    grid, found by two bisections; the feasible width nearest s_d is that depth's candidate, and
    the candidate with the smallest |s_d - s_w| over all depths wins (ties: the shallower cut).
    """
    n = family.arch.num_blocks
    placed: list[int] = []  # depths after which earlier levels put their exits (Alg. 1 line 4), distinct

    def cost(depth: int, width: float) -> int:
        stem, blocks, exits = component_costs(family, width, unit)
        return stem + sum(blocks[:depth]) + sum(exits[p - 1] for p in placed if p < depth) + exits[depth - 1]

    splits: list[Split] = []
    for level, (r, eps) in enumerate(zip(targets, epsilons), start=1):
        full = cost(n, 1.0)
        lowest_depth = splits[-1].depth if splits and nested else 1
        lowest_width = WIDTH_GRID.index(splits[-1].s_w) if splits and nested else 0

        def first_width(depth: int, at_least: float) -> int:
            """Index of the smallest grid width whose cost is >= at_least (len(grid) if none)."""
            lo, hi = lowest_width, len(WIDTH_GRID)
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (mid + 1, hi) if cost(depth, WIDTH_GRID[mid]) < at_least else (lo, mid)
            return lo

        best = None
        for depth in range(lowest_depth, n + 1):
            s_d = depth / n
            lo = first_width(depth, r * (1 - eps) * full)
            hi = first_width(depth, r * (1 + eps) * full * (1 + 1e-12) + 1e-9) - 1
            if lo > hi:
                continue
            k = min(max(round(s_d * 100) - 1, lo), hi)  # the feasible grid width nearest the diagonal
            for k in sorted({k, max(k - 1, lo), min(k + 1, hi)}):
                s_w = WIDTH_GRID[k]
                candidate = Split(level, r, eps, s_d, s_w, depth, cost(depth, s_w) / full)
                if candidate.within_epsilon and (best is None or abs(s_d - s_w) < abs(best.s_d - best.s_w)):
                    best = candidate
        if best is None:
            kept = f" (cutting as deep as level {level - 1} or deeper, at least as wide)" if nested and splits else ""
            raise HetflError(f"no 2-D split of {family.name} for level {level} is within split_epsilon {eps} of "
                             f"cost ratio {r}{kept}; raise split_epsilon, change budget_ratios"
                             + (" or set split_nested = false" if kept else ""))
        splits.append(best)
        if best.depth not in placed:
            placed.append(best.depth)
    return splits


def split_rows(splits: list[Split]) -> list[dict]:
    """ScaleFL's Table 1 as rows: level, target ratio, s_d, s_w, blocks kept, achieved ratio, within epsilon."""
    return [{"level": s.level, "target": s.target, "epsilon": s.epsilon, "s_d": round(s.s_d, 4), "s_w": s.s_w,
             "blocks": s.depth, "achieved_ratio": round(s.ratio, 4), "within_epsilon": s.within_epsilon}
            for s in splits]
