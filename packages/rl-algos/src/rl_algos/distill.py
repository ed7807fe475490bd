"""Distillation math. On-policy: per-token reverse KL of the student to its teacher(s) on the student's
own samples, and the per-token advantage it becomes (ROLL's on-policy distillation, verl's and
NeMo-RL's, TRL's GKD with lambda = 1 and beta = 1).

The student samples a response y ~ pi_s; every sampled token y_t is scored by the teacher. The
single-sample estimate of the reverse KL at position t is

    kl_t = log pi_s(y_t | y_<t) - log pi_t(y_t | y_<t)

whose expectation over y_t ~ pi_s is KL(pi_s || pi_t) at that prefix. Used as a per-token reward
`-kl_t` with no discount (each token's own advantage), a policy-gradient step
`-A_t * grad log pi_s(y_t)` lowers the reverse KL; `reverse_kl_loss` is the same quantity as a
loss to minimise directly.

Off-policy, token-level (`teacher_topk`, `kd_divergence`, `kd_loss`): the teacher's whole
next-token distribution at every position of given or teacher-generated text, and ROLL's six
`kd_objective` divergences of the student's to it (see the section below).

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


# --- Off-policy, token-level distillation on the teacher's distribution ------------------------
#
# The teacher scores every position of a given (or teacher-generated) sequence; the student is
# trained toward the teacher's whole next-token distribution there, not only the sampled token
# (Hinton et al. 2015; ROLL's offline distill pipeline, `kd_objective`). With `logits_topk` k > 0
# both distributions are restricted to the teacher's k most likely tokens and renormalised there
# (ROLL's rule: the student's logits are gathered at the teacher's top-k ids, then softmaxed);
# k = 0 keeps the whole vocabulary. Temperatures: the student's logits are divided by
# `kd_temperature`, the teacher's by `kd_temperature * teacher_temperature`.
#
# Per position, with p the teacher's and q the student's distribution over those tokens:
#
#   forward_kl         KL(p || q) = sum p (log p - log q)               (mean-seeking)
#   reverse_kl         KL(q || p) = sum q (log q - log p)               (mode-seeking)
#   skewed_forward_kl  KL(p || l p + (1 - l) q),  l = skew_lambda
#   skewed_reverse_kl  KL(q || (1 - l) p + l q)
#   js_divergence      (KL(p || m) + KL(q || m)) / 2,  m = (p + q) / 2
#   adaptive_kl        (g_head * forward + g_tail * reverse) / (g_head + g_tail): the teacher's
#                      tokens in ascending order of probability, the "tail" those whose cumulative
#                      teacher mass is <= adaptive_kl_alpha, g = sum |p - q| over each part
#                      (detached); Wu et al. 2024, as ROLL computes it


def teacher_topk(
    teacher_logits: torch.Tensor, k: int, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's distribution restricted to its `k` most likely tokens and renormalised
    there: `(log_probs [..., k], token ids [..., k])`, most likely first. `k = 0` (or k >= V):
    the whole vocabulary (ids `0..V-1` in order). teacher_logits: `[..., V]`; `temperature`:
    the logits are divided by it first (ROLL: `kd_temperature * teacher_temperature`)."""
    if k < 0:
        raise ValueError(f"k={k}: must be >= 0 (0: the whole vocabulary)")
    if temperature <= 0:
        raise ValueError(f"temperature={temperature}: must be > 0")
    logits = teacher_logits.float() / temperature
    v = logits.shape[-1]
    if k == 0 or k >= v:
        ids = torch.arange(v, device=logits.device).expand(logits.shape)
        return torch.log_softmax(logits, -1), ids
    top, ids = torch.topk(logits, k, dim=-1)
    return torch.log_softmax(top, -1), ids


def _forward_kl(q_log: torch.Tensor, p_log: torch.Tensor, **_: float) -> torch.Tensor:
    return (p_log.exp() * (p_log - q_log)).sum(-1)


def _reverse_kl(q_log: torch.Tensor, p_log: torch.Tensor, **_: float) -> torch.Tensor:
    return (q_log.exp() * (q_log - p_log)).sum(-1)


def _skewed_forward_kl(
    q_log: torch.Tensor, p_log: torch.Tensor, *, skew_lambda: float, **_: float
) -> torch.Tensor:
    p = p_log.exp()
    mixed = torch.log(skew_lambda * p + (1 - skew_lambda) * q_log.exp())
    return (p * (p_log - mixed)).sum(-1)


def _skewed_reverse_kl(
    q_log: torch.Tensor, p_log: torch.Tensor, *, skew_lambda: float, **_: float
) -> torch.Tensor:
    q = q_log.exp()
    mixed = torch.log((1 - skew_lambda) * p_log.exp() + skew_lambda * q)
    return (q * (q_log - mixed)).sum(-1)


def _js_divergence(q_log: torch.Tensor, p_log: torch.Tensor, **_: float) -> torch.Tensor:
    p, q = p_log.exp(), q_log.exp()
    m_log = torch.log((p + q) / 2)
    return ((p * (p_log - m_log)).sum(-1) + (q * (q_log - m_log)).sum(-1)) / 2


def _adaptive_kl(
    q_log: torch.Tensor, p_log: torch.Tensor, *, adaptive_kl_alpha: float, **_: float
) -> torch.Tensor:
    p, q = p_log.exp(), q_log.exp()
    p_sorted, order = p.sort(-1)  # ascending: the tail first
    gap = (p_sorted - q.gather(-1, order)).abs()
    tail = (p_sorted.cumsum(-1) <= adaptive_kl_alpha).to(p.dtype)
    g_head = (gap * (1 - tail)).sum(-1).detach()
    g_tail = (gap * tail).sum(-1).detach()
    total = (g_head + g_tail).clamp(min=1e-30)
    return (g_head * _forward_kl(q_log, p_log) + g_tail * _reverse_kl(q_log, p_log)) / total


KD_OBJECTIVES = {
    "forward_kl": _forward_kl,
    "reverse_kl": _reverse_kl,
    "adaptive_kl": _adaptive_kl,
    "skewed_forward_kl": _skewed_forward_kl,
    "skewed_reverse_kl": _skewed_reverse_kl,
    "js_divergence": _js_divergence,
}
"""ROLL's `kd_objective` names -> per-position divergence of (student, teacher) log-probs."""


def kd_divergence(
    student_logits: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    objective: str = "forward_kl",
    *,
    kd_temperature: float = 1.0,
    adaptive_kl_alpha: float = 0.5,
    skew_lambda: float = 0.1,
) -> torch.Tensor:
    """`[...]` per-position divergence of `objective` (a name of `KD_OBJECTIVES`) between the
    student and the teacher.

    student_logits: `[..., k]` the student's logits at the teacher's token ids (`teacher_topk`'s;
    the whole vocabulary when k = V), softmaxed here over those k after dividing by
    `kd_temperature`; teacher_log_probs: `[..., k]` `teacher_topk`'s log-probs. Differentiable
    in `student_logits`."""
    fn = KD_OBJECTIVES.get(objective)
    if fn is None:
        raise ValueError(f"kd_objective={objective!r}: one of {sorted(KD_OBJECTIVES)}")
    if student_logits.shape != teacher_log_probs.shape:
        raise ValueError(
            f"shapes differ: student {tuple(student_logits.shape)}, teacher "
            f"{tuple(teacher_log_probs.shape)}"
        )
    if kd_temperature <= 0:
        raise ValueError(f"kd_temperature={kd_temperature}: must be > 0")
    if not 0 < skew_lambda < 1:
        raise ValueError(f"skew_lambda={skew_lambda}: must be in (0, 1)")
    q_log = torch.log_softmax(student_logits.float() / kd_temperature, -1)
    return fn(q_log, teacher_log_probs.float(), adaptive_kl_alpha=adaptive_kl_alpha,
              skew_lambda=skew_lambda)  # fmt: skip


def kd_loss(
    divergence: torch.Tensor, mask: torch.Tensor, token_count: float | None = None
) -> torch.Tensor:
    """Scalar: `divergence [B, T]` summed over `mask`ed positions (True: the position's token is
    trained on) divided by `token_count` (None: the mask's count; a global count when the batch
    is a micro-batch of a larger one), 0 when nothing is masked."""
    if divergence.shape != mask.shape:
        raise ValueError(f"shapes differ: {tuple(divergence.shape)} vs mask {tuple(mask.shape)}")
    m = mask.to(divergence.dtype)
    count = m.sum() if token_count is None else torch.as_tensor(token_count, dtype=m.dtype)
    return (divergence * m).sum() / count.clamp(min=1)


__all__ = [
    "KD_OBJECTIVES",
    "average_teachers",
    "combine_teachers",
    "distill_advantages",
    "kd_divergence",
    "kd_loss",
    "reverse_kl_loss",
    "reverse_kl_per_token",
    "route_teachers",
    "teacher_topk",
]
