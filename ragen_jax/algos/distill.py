"""On-policy distillation: a frozen teacher's per-token reverse KL as a dense advantage.

The student samples; a teacher sharing its tokenizer scores the sampled tokens. At each response
token y_t the single-sample estimate of KL(student ‖ teacher) is

    k_t = log π_student(y_t) − log π_teacher(y_t)

(GKD, Agarwal et al. 2023; Qwen3's report). It enters as a per-token advantage −coef·k_t, added
to the environment's advantage with no discount and no whitening, and is then optimised by the
configured policy loss like any other advantage: tokens the teacher finds likelier than the
student are pushed up, the others down. Its mean over response tokens falls as the student
approaches the teacher (`distill/reverse_kl`).

Both log-probs come from the train step's no-gradient pass (`train_step.old_pass`), at the
rollout's temperature, so k_t compares the distributions sampled from.

Dimensions: B rows (episodes or turns).  T tokens.
"""

import jax
import jax.numpy as jnp

from ragen_jax.algos.advantages import masked_mean


def reverse_kl(student_logp_BxT, teacher_logp_BxT, mask_BxT):
  """k_BxT = log π_student − log π_teacher at masked tokens, 0 elsewhere."""
  k_BxT = student_logp_BxT - teacher_logp_BxT
  return jnp.where(mask_BxT > 0, k_BxT, 0.0)


def add_distill_advantage(adv_BxT, student_logp_BxT, teacher_logp_BxT, mask_BxT, coef, skipped):
  """(adv_BxT − coef·k_BxT, metrics): the environment's advantage plus the dense distillation
  term; a skipped step (nothing kept) stays all-zero. Gradient-free (inputs are stopped)."""
  k_BxT = jax.lax.stop_gradient(reverse_kl(student_logp_BxT, teacher_logp_BxT, mask_BxT))
  adv_BxT = jnp.where(skipped, 0.0, adv_BxT - coef * k_BxT)
  maskf_BxT = (mask_BxT > 0).astype(jnp.float32)
  return adv_BxT, {"distill/reverse_kl": masked_mean(k_BxT, maskf_BxT)}
