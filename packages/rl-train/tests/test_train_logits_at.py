"""Distribution-level distillation through a backend: `forward_topk` gives a teacher's top-k
next-token distribution at every position (aligned with the tokens like the log-probs: column 0
and padding 0), and a loss that names `logits_at` gets the student's logits gathered at those ids
(with grad), equal to a direct forward's; training on the forward KL moves the student toward
the teacher."""

import pytest
import torch

import rl_train
from rl_algos.distill import kd_divergence, kd_loss
from rl_train.testing import make_batch


def _backend(path, role="actor", **extra):
    args = {"per_device_train_batch_size": 4, "infer_batch_size": 3, "learning_rate": 1e-2,
            **extra}  # fmt: skip
    return rl_train.build_backend("hf_infer", role=role, model_path=path, training_args=args)


def _logits(backend, batch):
    with torch.no_grad():
        return backend.model(input_ids=batch["input_ids"],
                             attention_mask=batch["attention_mask"]).logits.float()  # fmt: skip


@pytest.mark.parametrize("k", [5, 0])
def test_forward_topk_is_the_models_top_k_aligned_with_the_tokens(tiny_model_path, k):
    teacher = _backend(tiny_model_path, role="reference")
    batch = make_batch(5, 12, seed=3)
    lp, ids = teacher.forward_topk(batch, k, temperature=2.0)
    logits = _logits(teacher, batch)[:, :-1] / 2.0
    v = logits.shape[-1]
    assert lp.shape == ids.shape == (5, 12, k or v)
    valid = batch["attention_mask"][:, 1:].bool()
    want_ids = logits.topk(k, -1).indices if k else torch.arange(v).expand(logits.shape)
    want_lp = torch.log_softmax(logits.gather(-1, want_ids), -1)
    torch.testing.assert_close(lp[:, 1:][valid], want_lp[valid], atol=1e-5, rtol=1e-5)
    assert torch.equal(ids[:, 1:][valid], want_ids[valid])
    assert float(lp[:, 0].abs().sum()) == 0 and float(lp[:, 1:][~valid].abs().sum()) == 0


def _forward_kl_loss(mb, out, ctx):
    div = kd_divergence(out.logits_at, mb["teacher_lp"], "forward_kl")
    return kd_loss(div, mb["response_mask"], ctx.global_tokens), {"kd": kd_loss(
        div.detach(), mb["response_mask"], ctx.global_tokens)}  # fmt: skip


_forward_kl_loss.logits_at = "teacher_ids"  # type: ignore[attr-defined]


def test_a_loss_naming_logits_at_gets_the_students_logits_and_learns(
    tiny_model_path, tiny_model_tied_path
):
    batch = make_batch(8, 12, seed=4)
    teacher = _backend(tiny_model_tied_path, role="reference")
    lp, ids = teacher.forward_topk(batch, 8)
    batch = {**batch, "teacher_lp": lp, "teacher_ids": ids}
    student = _backend(tiny_model_path)
    seen = []

    def spy(mb, out, ctx):
        seen.append((mb, out.logits_at.detach().clone()))
        return _forward_kl_loss(mb, out, ctx)

    spy.logits_at = "teacher_ids"  # type: ignore[attr-defined]
    before = _logits(student, batch)
    student.train_step(batch, spy, epochs=1)
    mb, at = seen[0]
    want = before[: mb["input_ids"].shape[0], :-1].gather(-1, mb["teacher_ids"][:, 1:])
    valid = mb["attention_mask"][:, 1:].bool()
    torch.testing.assert_close(at[:, 1:][valid], want[valid], atol=1e-5, rtol=1e-5)
    losses = [student.train_step(batch, _forward_kl_loss, epochs=1)["actor/kd"] for _ in range(8)]
    assert losses[-1] < 0.7 * losses[0], losses
