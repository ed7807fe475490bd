"""On-policy distillation: per-token reverse KL of the student to its teacher(s) on the student's
own samples, and the per-token advantage it becomes (ROLL's on-policy distillation, verl's and
NeMo-RL's, TRL's GKD with lambda = 1 and beta = 1).

The student samples a response y ~ pi_s; every sampled token y_t is scored by the teacher. The
single-sample estimate of the reverse KL at position t is

    kl_t = log pi_s(y_t | y_<t) - log pi_t(y_t | y_<t)

whose expectation over y_t ~ pi_s is KL(pi_s || pi_t) at that prefix. Used as a per-token reward
`-kl_t` with no discount (each token's own advantage), a policy-gradient step
`-A_t * grad log pi_s(y_t)` lowers the reverse KL; `reverse_kl_loss` is the same quantity as a
loss to minimise directly.

Several teachers: each row's teacher is picked by its domain (`route_teachers`: a `[B]` index),
or the teachers' log-probs are averaged with weights (`average_teachers`). Pure functions, torch
only.
"""

from __future__ import annotations

import torch


def reverse_kl_per_token(
    student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """`[B, T]` single-sample reverse KL per sampled token, `student - teacher`, 0 where `mask`
    is False (prompt and padding).

    student_log_probs, teacher_log_probs: `[B, T]` log-probs of the sampled tokens under the
    student and the teacher; mask: `[B, T]` bool (or 0/1), True on response tokens.
    """
    if student_log_probs.shape != teacher_log_probs.shape or student_log_probs.shape != mask.shape:
        raise ValueError(
            f"shapes differ: student {tuple(student_log_probs.shape)}, teacher "
            f"{tuple(teacher_log_probs.shape)}, mask {tuple(mask.shape)}"
        )
    m = mask.to(student_log_probs.dtype)
    return (student_log_probs - teacher_log_probs) * m


def distill_advantages(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """`[B, T]` per-token advantages `-kl_coef * (student - teacher)` on masked tokens, 0
    elsewhere (no discount, no baseline: the advantage of token t is its own negated reverse
    KL). `kl_coef`: a float, or a `[B]` tensor (one coefficient per row, e.g. its teacher's)."""
    kl = reverse_kl_per_token(student_log_probs, teacher_log_probs, mask)
    coef = torch.as_tensor(kl_coef, dtype=kl.dtype, device=kl.device)
    if coef.dim() == 1:
        coef = coef[:, None]
    return -coef * kl


def reverse_kl_loss(
    student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Scalar: the token-mean of `reverse_kl_per_token` over masked tokens (0 when none is
    masked); the metric of how far the student is from its teacher on its own samples. Its
    gradient through the sampled tokens' log-probs is not the on-policy gradient (the samples
    depend on the student): train with `distill_advantages` and a policy-gradient loss."""
    kl = reverse_kl_per_token(student_log_probs, teacher_log_probs, mask)
    return kl.sum() / mask.to(kl.dtype).sum().clamp(min=1)


def route_teachers(teacher_log_probs: torch.Tensor, teacher_index: torch.Tensor) -> torch.Tensor:
    """`[B, T]`: row b takes the log-probs of teacher `teacher_index[b]`.

    teacher_log_probs: `[K, B, T]` (K teachers, each scored every row); teacher_index: `[B]`
    integers in [0, K).
    """
    k, b = teacher_log_probs.shape[0], teacher_log_probs.shape[1]
    if teacher_index.shape != (b,):
        raise ValueError(f"teacher_index has shape {tuple(teacher_index.shape)}, expected ({b},)")
    if b and (int(teacher_index.min()) < 0 or int(teacher_index.max()) >= k):
        raise ValueError(f"teacher_index out of range [0, {k}): {teacher_index.tolist()}")
    rows = torch.arange(b, device=teacher_log_probs.device)
    return teacher_log_probs[teacher_index.long(), rows]


def average_teachers(
    teacher_log_probs: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """`[B, T]`: the weighted mean of K teachers' log-probs (`weights` `[K]`, >= 0, normalised
    here; None: equal weights), i.e. the log of a weighted geometric mixture up to its
    normaliser. teacher_log_probs: `[K, B, T]`."""
    k = teacher_log_probs.shape[0]
    if weights is None:
        weights = torch.ones(k, dtype=teacher_log_probs.dtype, device=teacher_log_probs.device)
    if weights.shape != (k,) or bool((weights < 0).any()) or float(weights.sum()) <= 0:
        raise ValueError(f"weights must be [{k}] non-negative with a positive sum: {weights}")
    w = (weights / weights.sum()).to(teacher_log_probs.dtype)
    return (w[:, None, None] * teacher_log_probs).sum(0)


def combine_teachers(
    teacher_log_probs: torch.Tensor, coefs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Several teachers per row, ROLL's rule: the advantage is `-sum_k coefs[k, b] * (student -
    teacher_k)`, which equals `distill_advantages(student, mixed, mask, total)` with

        mixed[b] = sum_k coefs[k, b] * teacher_k[b] / total[b],   total[b] = sum_k coefs[k, b]

    Returns `(mixed [B, T], total [B])`. teacher_log_probs: `[K, B, T]` (a teacher's rows it
    does not teach may hold anything finite); coefs: `[K, B]` >= 0, each teacher's KL
    coefficient on the rows it teaches, 0 elsewhere. Routing is one nonzero per column;
    averaging, equal coefficients summing to the KL coefficient. A row with total 0 gets the
    plain mean (its advantages are 0 anyway)."""
    if coefs.shape != teacher_log_probs.shape[:2]:
        raise ValueError(
            f"coefs has shape {tuple(coefs.shape)}, expected {tuple(teacher_log_probs.shape[:2])}"
        )
    if bool((coefs < 0).any()):
        raise ValueError("coefs must be >= 0")
    c = coefs.to(teacher_log_probs.dtype)
    total = c.sum(0)
    weights = torch.where(total > 0, c / total.clamp(min=1e-30), 1.0 / c.shape[0])
    return (weights[:, :, None] * teacher_log_probs).sum(0), total


__all__ = [
    "average_teachers",
    "combine_teachers",
    "distill_advantages",
    "reverse_kl_loss",
    "reverse_kl_per_token",
    "route_teachers",
]
