"""Losses over the exits of a multi-exit model."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def exits_ce(logits: list[torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    """Sum of the cross-entropies of the given exits' logits."""
    return sum(F.cross_entropy(z, target) for z in logits)


def label_masked(logits: list[torch.Tensor], present: torch.Tensor | None) -> list[torch.Tensor]:
    """The exits' logits with those of the classes not in ``present`` (a boolean vector over the classes, the ones the
    client holds samples of; None: no mask) set to 0, as HeteroFL's and FedRolex's code masks them in training
    (``methods.options.LabelMask``): a masked class still counts in the softmax's normaliser, at logit 0, but passes
    no gradient to its classifier row."""
    if present is None:
        return logits
    return [z.masked_fill(~present, 0.0) for z in logits]


def client_classes(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The boolean vector over ``num_classes`` classes that is True at every class among ``labels``."""
    present = torch.zeros(num_classes, dtype=torch.bool, device=labels.device)
    present[labels] = True
    return present


def ensemble_logits(logits: list[torch.Tensor]) -> torch.Tensor:
    """The ensemble's logits: the mean of the exits' logits (DepthFL Sec. 4)."""
    return torch.stack(logits).mean(0)


def mutual_kd(logits: list[torch.Tensor]) -> torch.Tensor:
    """DepthFL Eq. (1)'s distillation term: 1/(n-1) sum_i sum_{j != i} KL(p_j || p_i), teachers p_j detached.

    Every exit is the student of every other exit (T = 1); the gradient reaches only the student
    side, so a deep exit learns from a shallow one and vice versa. Zero for a single exit.
    """
    n = len(logits)
    if n < 2:
        return logits[0].new_zeros(())
    log_p = [F.log_softmax(z, dim=1) for z in logits]
    teachers = [lp.detach() for lp in log_p]
    total = sum(F.kl_div(log_p[i], teachers[j], reduction="batchmean", log_target=True)
                for i in range(n) for j in range(n) if j != i)
    return total / (n - 1)


def weighted_exits_with_last_teacher(logits: list[torch.Tensor], target: torch.Tensor, beta: float,
                                     tau: float, normaliser: str = "sum") -> torch.Tensor:
    """ScaleFL Eq. (5): sum_i i (CE_i + beta tau^2 KL(p_last^tau || p_i^tau)) / sum_i i, the teacher detached.

    Exit i of n is weighted by i; the last exit is the teacher of the earlier ones at temperature
    tau (its own KL term is zero). The paper writes the normaliser as 1/(l(l+1)), half of
    1/sum_i i; hetfl divides by sum_i i = n(n+1)/2 as the authors' code does, so a single-exit
    model's loss is its plain CE (the choice only rescales the learning rate by 2). The authors'
    code does not detach the teacher (a bug not copied). ``normaliser = "last"``
    divides by the last exit's weight n instead, so the last exit's CE has weight 1 as in a
    single-exit model: a control for how much Eq. (5)'s normaliser shrinks the step of the main path.
    """
    n = len(logits)
    log_teacher = F.log_softmax(logits[-1].detach() / tau, dim=1)
    total = logits[-1].new_zeros(())
    for i, z in enumerate(logits, start=1):
        term = F.cross_entropy(z, target)
        if i < n and beta:
            kl = F.kl_div(F.log_softmax(z / tau, dim=1), log_teacher, reduction="batchmean", log_target=True)
            term = term + beta * tau**2 * kl
        total = total + i * term
    return total / (n * (n + 1) / 2 if normaliser == "sum" else n)


def distilled_ce(student: torch.Tensor, teacher: torch.Tensor, target: torch.Tensor, alpha: float,
                 tau: float) -> torch.Tensor:
    """FjORD's self-distillation loss of a sampled width p: (1 - alpha) CE(z_p, y) + alpha tau^2 KL(q_pmax^tau ||
    q_p^tau), the teacher (the client's widest width p_max) detached; the KL averaged over the batch.

    The paper weighs CE against the KL of the softened outputs at temperature tau; the tau^2 factor (Hinton et al.,
    2015) keeps the KL's gradient on the CE's scale and is 1 at the authors' tau = 1. At alpha = tau = 1 the
    gradient is that of the authors' Flower baseline, which takes the CE of z_p against softmax(z_pmax) (equal to
    the KL up to the teacher's entropy, a constant).
    """
    log_teacher = F.log_softmax(teacher.detach() / tau, dim=1)
    kl = F.kl_div(F.log_softmax(student / tau, dim=1), log_teacher, reduction="batchmean", log_target=True)
    kd = alpha * tau**2 * kl
    return kd + (1 - alpha) * F.cross_entropy(student, target) if alpha < 1 else kd


def deep_mutual_learning(logits: list[torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    """sum_m [CE_m + 1/(M-1) sum_{m' != m} KL(p_m' || p_m)] over M models' logits, teachers detached (T = 1).

    m-FeDepth's objective (FeDepth Sec. "Exploit sufficient memory", after Zhang et al. 2018's deep
    mutual learning). The paper writes it with a factor 1/M; hetfl sums, so each model takes exactly
    DML's step for its own loss (as the authors' code, one optimizer step per model, does) rather than
    1/M of it, which would only divide the learning rate by M. One model: its plain CE.
    """
    ce = exits_ce(logits, target)
    return ce + mutual_kd(logits) if len(logits) > 1 else ce


def per_exit_ce(logits: list[torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    """The cross-entropy of every exit, stacked (n,)."""
    return torch.stack([F.cross_entropy(z, target) for z in logits])


def best_exit_kd(logits: list[torch.Tensor], teacher: int | torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """ReeFL Eq. (6): sum over exits e != teacher of tau^2 KL(p_teacher^tau || p_e^tau), the teacher detached.

    The KL is averaged over the batch (the 1/N_i of Eq. (6)); the teacher's own term is zero, and so
    is the whole term for a single exit. ``teacher`` may be a tensor (chosen on the device without a
    synchronisation, and per client under ``vmap``): its own term is then multiplied by zero, which
    leaves the sum bit-identical.
    """
    teacher = torch.as_tensor(teacher, device=logits[0].device)
    chosen = torch.stack(logits).index_select(0, teacher.reshape(1))[0]
    log_teacher = F.log_softmax(chosen.detach() / tau, dim=1)
    total = logits[0].new_zeros(())
    for e, z in enumerate(logits):
        kl = F.kl_div(F.log_softmax(z / tau, dim=1), log_teacher, reduction="batchmean", log_target=True)
        total = total + (teacher != e) * kl
    return tau**2 * total


def running_ce(value: torch.Tensor | None, ce: torch.Tensor, zeta: float) -> torch.Tensor:
    """ReeFL Sec. 3.2's running estimate of each exit's training CE on one client: L <- (1 - zeta) L + zeta L_new.

    It starts (``value`` None) at zero with each client update (a new round; the authors' code
    resets it per round), so the first teacher is the exit of lowest CE on the first batch. The
    teacher, ``argmin`` of the returned estimate, is chosen after the current batch's CE (n,) is
    folded in; ties go to the shallower exit.
    """
    ce = ce.detach()
    return zeta * ce if value is None else (1 - zeta) * value + zeta * ce
