"""Typed, validated hyper-parameters of the StarPO update.

Defaults are RAGEN's `config/base.yaml` (shared/reference/ragen.md §3.4); the config-file layer
maps onto this dataclass. Every invalid combination raises a ValueError naming the field.

Dimensions: none here (scalars only); B in `check_batch` is the number of episodes.
"""

import dataclasses

from ragen_jax.algos.filtering import STRATEGIES
from ragen_jax.algos.losses import AGG_MODES, KL_KINDS

ADV_ESTIMATORS = ("gae", "grpo", "brpo", "arpo", "drgrpo")
FILTER_METRICS = ("reward_variance", "reward", "reward_sum")


@dataclasses.dataclass(frozen=True)
class PPOConfig:
  """StarPO / PPO update settings.

  Attributes:
    adv_estimator: "gae" (PPO with critic), or critic-free "grpo" (group mean/std), "drgrpo"
      (group mean only), "brpo" (batch mean/std), "arpo" (raw score).
    gamma, lam: GAE discount and trace parameters.
    clip_low, clip_high, clip_c: PPO ratio clip range [1 − low, 1 + high] and dual-clip c > 1.
    agg_mode: loss aggregation (losses.AGG_MODES), shared by actor and critic.
    loss_scale_factor: the fixed divisor of "seq-mean-token-sum-norm" (Dr.GRPO); None uses the
      padded length T of the batch (here the whole conversation, not only the response).
    entropy_coeff: weight of the entropy bonus (loss −= coeff · agg(H)).
    use_kl_loss, kl_coef, kl_type: KL-to-reference loss term (needs reference parameters).
    ppo_epochs: passes over the batch per train step.
    num_minibatches: optimizer steps per epoch; must divide the batch size.
    micro_batches: gradient-accumulation chunks per minibatch; must divide the minibatch.
    shuffle: reshuffle episodes into minibatches every epoch.
    actor_lr, critic_lr: constant AdamW learning rates (betas 0.9 / 0.999).
    weight_decay: AdamW decoupled weight decay for both models.
    grad_clip: global-norm clip, applied to actor and critic gradients separately.
    value_clip: critic value clip range κ around the old values.
    critic: "separate" (own model, RAGEN) or "shared" (value head on the actor's trunk).
    vf_coef: weight of the value loss in the joint loss of the shared-trunk critic.
    temperature: rollout sampling temperature; logits are divided by it.
    recompute_old_logprobs: old log-probs from the current actor (veRL, RAGEN) rather than
      the rollout engine's `logprobs_BxT`.
    positive_advantages_only: replace each advantage A by max(A, 0): episodes (or tokens, under
      GAE) below the baseline get no gradient, so nothing is pushed down (not in RAGEN).
    filter_*: StarPO-S rollout filter (filtering.filter_groups); top_p 1.0 with include_zero
      keeps everything (RAGEN's default).
    vocab_chunk: vocabulary chunk of the log-prob / entropy computation.
  """

  adv_estimator: str = "gae"
  gamma: float = 1.0
  lam: float = 1.0
  clip_low: float = 0.2
  clip_high: float = 0.28
  clip_c: float = 3.0
  agg_mode: str = "token-mean"
  loss_scale_factor: float | None = None
  entropy_coeff: float = 0.001
  use_kl_loss: bool = False
  kl_coef: float = 0.0
  kl_type: str = "k1"
  ppo_epochs: int = 1
  num_minibatches: int = 4
  micro_batches: int = 1
  shuffle: bool = True
  actor_lr: float = 1e-6
  critic_lr: float = 1e-5
  weight_decay: float = 0.01
  grad_clip: float = 1.0
  value_clip: float = 0.5
  critic: str = "separate"
  vf_coef: float = 1.0
  temperature: float = 1.0
  recompute_old_logprobs: bool = True
  positive_advantages_only: bool = False
  filter_strategy: str = "top_p"
  filter_value: float = 1.0
  filter_metric: str = "reward_variance"
  filter_type: str = "largest"
  filter_include_zero: bool = True
  filter_prob_mode: str = "linear"
  filter_eps: float = 0.01
  vocab_chunk: int = 8192

  def __post_init__(self):
    def check(ok, msg):
      if not ok:
        raise ValueError(f"PPOConfig: {msg}")

    check(
        self.adv_estimator in ADV_ESTIMATORS,
        f"adv_estimator must be one of {ADV_ESTIMATORS}, got {self.adv_estimator!r}",
    )
    check(
        0.0 <= self.gamma <= 1.0 and 0.0 <= self.lam <= 1.0,
        f"gamma and lam must lie in [0, 1], got {self.gamma}, {self.lam}",
    )
    check(0.0 < self.clip_low < 1.0, f"clip_low must lie in (0, 1), got {self.clip_low}")
    check(self.clip_high > 0.0, f"clip_high must be > 0, got {self.clip_high}")
    check(self.clip_c > 1.0, f"clip_c (dual clip) must be > 1, got {self.clip_c}")
    check(self.agg_mode in AGG_MODES, f"agg_mode must be one of {AGG_MODES}, got {self.agg_mode!r}")
    check(
        self.loss_scale_factor is None or self.loss_scale_factor > 0,
        f"loss_scale_factor must be None or > 0, got {self.loss_scale_factor}",
    )
    check(self.kl_type in KL_KINDS, f"kl_type must be one of {KL_KINDS}, got {self.kl_type!r}")
    check(
        self.entropy_coeff >= 0.0 and self.kl_coef >= 0.0, "entropy_coeff and kl_coef must be >= 0"
    )
    for name in ("ppo_epochs", "num_minibatches", "micro_batches", "vocab_chunk"):
      value = getattr(self, name)
      check(isinstance(value, int) and value >= 1, f"{name} must be a positive int, got {value!r}")
    for name in ("actor_lr", "critic_lr", "grad_clip", "value_clip", "temperature"):
      check(getattr(self, name) > 0.0, f"{name} must be > 0, got {getattr(self, name)}")
    check(self.weight_decay >= 0.0, f"weight_decay must be >= 0, got {self.weight_decay}")
    check(
        self.critic in ("separate", "shared"),
        f"critic must be 'separate' or 'shared', got {self.critic!r}",
    )
    check(
        self.filter_strategy in STRATEGIES,
        f"filter_strategy must be one of {STRATEGIES}, got {self.filter_strategy!r}",
    )
    check(
        self.filter_metric in FILTER_METRICS,
        f"filter_metric must be one of {FILTER_METRICS}, got {self.filter_metric!r}",
    )
    check(
        self.filter_type in ("largest", "smallest"),
        f"filter_type must be 'largest' or 'smallest', got {self.filter_type!r}",
    )
    check(
        self.filter_prob_mode in ("linear", "softmax"),
        f"filter_prob_mode must be 'linear' or 'softmax', got {self.filter_prob_mode!r}",
    )
    check(
        not (
            self.filter_strategy == "top_p"
            and self.filter_prob_mode == "linear"
            and self.filter_type == "smallest"
        ),
        "top_p in linear mode supports filter_type='largest' only",
    )
    check(self.filter_value > 0.0, f"filter_value must be > 0, got {self.filter_value}")
    if self.filter_strategy == "min_p":
      check(self.filter_value <= 1.0, "min_p filter_value must lie in (0, 1]")

  @property
  def uses_critic(self):
    return self.adv_estimator == "gae"

  def check_batch(self, batch_size):
    """Raises ValueError unless batch_size splits into minibatches and micro-batches."""
    if batch_size % self.num_minibatches:
      raise ValueError(
          f"PPOConfig: batch size {batch_size} is not divisible by "
          f"num_minibatches {self.num_minibatches}"
      )
    mini = batch_size // self.num_minibatches
    if mini % self.micro_batches:
      raise ValueError(
          f"PPOConfig: minibatch size {mini} is not divisible by "
          f"micro_batches {self.micro_batches}"
      )
