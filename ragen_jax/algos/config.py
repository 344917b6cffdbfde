"""Typed, validated hyper-parameters of the StarPO update.

Defaults are RAGEN's `config/base.yaml` (shared/reference/ragen.md §3.4); the config-file layer
maps onto this dataclass. Every invalid combination raises a ValueError naming the field.

Dimensions: none here (scalars only); B in `check_batch` is the number of episodes.
"""

import dataclasses
from typing import Annotated

from absl import logging

from ragen_jax.algos import losses
from ragen_jax.algos.advantages import GIGPO_NORMS
from ragen_jax.algos.filtering import STRATEGIES
from ragen_jax.algos.losses import AGG_MODES, KL_KINDS, POLICY_LOSSES, ROLLOUT_CORRECTIONS
from ragen_jax.algos.optim import MOMENT_DTYPES
from ragen_jax.config_checks import check_fields, check_value, OneOf, Range
from ragen_jax.config_checks import NonNegativeFloat, PositiveFloat, PositiveInt, UnitFloat

ADV_ESTIMATORS = ("gae", "bi_level_gae", "grpo", "brpo", "arpo", "drgrpo", "gigpo")
CRITIC_ESTIMATORS = ("gae", "bi_level_gae")
# Settings that only GAE and its critic read: under gigpo a changed one is named in a warning.
CRITIC_FIELDS = ("gamma", "lam", "high_level_gamma", "critic", "critic_lr", "value_clip", "vf_coef")
FILTER_METRICS = ("reward_variance", "reward", "reward_sum")


@dataclasses.dataclass(frozen=True)
class PPOConfig:
  """StarPO / PPO update settings.

  Attributes:
    adv_estimator: "gae" (PPO with critic), "bi_level_gae" (PPO with critic, turn-level GAE then
      token-level GAE inside each turn: advantages.compute_bi_level_gae), or critic-free "grpo"
      (group mean/std), "drgrpo" (group mean only), "brpo" (batch mean/std), "arpo" (raw score),
      "gigpo" (GiGPO: episode-level group advantage plus ω times the step-level advantage among
      turns of a group acting from the same state: advantages.gigpo).
    gigpo_omega, gigpo_gamma, gigpo_norm: GiGPO's step-level weight ω (verl-agent 1.0), its
      discount across turns (0.95) and its normalisation, "mean" (subtract the group mean,
      verl-agent's default) or "mean_std" (also divide by the sample std + 1e-6).
    gamma, lam: GAE discount and trace parameters.
    high_level_gamma: bi_level_gae's discount across turns (RAGEN 0.95).
    policy_loss: the policy loss (losses.policy_loss): "ppo" (clipped ratio with dual clip),
      "gspo" (GSPO-token: the row's length-normalised sequence ratio, clipped) or "cispo" (the
      clipped ratio as a detached weight of −A·logp). The mode's defaults
      (losses.POLICY_LOSS_MODES) stand for clip_low, clip_high and agg_mode when they are None;
      `policy` holds the settings in force.
    clip_low, clip_high: clip range [1 − low, 1 + high] of the ratio (ppo), the sequence ratio
      (gspo) or the weight (cispo). None: the mode's (ppo 0.2 / 0.28, gspo 3e-4 / 4e-4, cispo
      1.0 / 0.2). clip_low lies in (0, 1), except under cispo (> 0; >= 1: no lower bound).
    clip_c: PPO's dual clip c > 1 on negative advantages (gspo and cispo have none).
    agg_mode: loss aggregation (losses.AGG_MODES), shared by actor and critic. None: the mode's
      (ppo and cispo "token-mean", gspo "seq-mean-token-mean").
    loss_scale_factor: the fixed divisor of "seq-mean-token-sum-norm" (Dr.GRPO); None uses the
      padded length T of the batch (here the whole conversation, not only the response).
    entropy_coeff: weight of the entropy bonus (loss −= coeff · agg(H)).
    use_kl_loss, kl_coef, kl_type: KL-to-reference loss term (needs reference parameters).
    distill_teacher: on-policy distillation's teacher (algos.distill): a training run's workdir,
      a Hugging Face directory or a GGUF file, loaded as the policy is, with the student's
      tokenizer (another is refused before training). None: no teacher.
    distill_coef: weight of the dense advantage −coef·k_t, k_t = log π_student(y_t) −
      log π_teacher(y_t), added to the environment's advantage (0: only `distill/reverse_kl`
      is measured).
    ppo_epochs: passes over the batch per train step.
    num_minibatches: optimizer steps per epoch; must divide the batch size.
    micro_batches: gradient-accumulation chunks per minibatch; must divide the minibatch.
    shuffle: reshuffle episodes into minibatches every epoch.
    actor_lr, critic_lr: constant AdamW learning rates (betas 0.9 / 0.999).
    weight_decay: AdamW decoupled weight decay for both models.
    moment_dtype: storage dtype of AdamW's two moments, "float32" or "bfloat16" (optim.py: the
      update is computed in float32 either way; what bfloat16 moments lose).
    grad_clip: global-norm clip, applied to actor and critic gradients separately.
    value_clip: critic value clip range κ around the old values.
    critic: "separate" (own model, RAGEN) or "shared" (value head on the actor's trunk).
    vf_coef: weight of the value loss in the joint loss of the shared-trunk critic.
    recompute_old_logprobs: old log-probs from the current actor (veRL, RAGEN) rather than
      the rollout engine's `logprobs_BxT`.
    rollout_correction: weights on each token's policy loss for the gap between the policy that
      sampled the batch (its `logprobs_BxT`) and the recomputed old policy, r = π_old/μ:
      "none", "tis" (min(r, C)), "icepop" (tokens with r outside [1/C, C] masked) or
      "seq_mask" (a sequence masked when its tokens' geometric-mean r is outside [1/C, C])
      (losses.rollout_correction_weights). Needs recompute_old_logprobs (else r = 1).
    rollout_correction_cap: C >= 1 (2.0: Tunix's and SkyRL's token threshold).
    positive_advantages_only: replace each advantage A by max(A, 0): episodes (or tokens, under
      GAE) below the baseline get no gradient, so nothing is pushed down (not in RAGEN).
    filter_*: StarPO-S rollout filter (filtering.filter_groups); top_p 1.0 with include_zero
      keeps everything (RAGEN's default).
    vocab_chunk: vocabulary chunk of the log-prob / entropy computation.
    train_vision_tower: Qwen2.5-VL: the update trains the vision tower too (default: frozen,
      no gradient reaches it and the optimizer leaves it as it is, weight decay included).
  """

  adv_estimator: Annotated[str, OneOf(ADV_ESTIMATORS)] = "gae"
  gamma: UnitFloat = 1.0
  lam: UnitFloat = 1.0
  high_level_gamma: UnitFloat = 0.95
  gigpo_omega: NonNegativeFloat = 1.0
  gigpo_gamma: UnitFloat = 0.95
  gigpo_norm: Annotated[str, OneOf(GIGPO_NORMS)] = "mean"
  policy_loss: Annotated[str, OneOf(POLICY_LOSSES)] = "ppo"
  # Knobs that may be None are checked in __post_init__ (an Annotated type would break the
  # config's None placeholder): None is the policy loss's default, or no factor.
  clip_low: float | None = None
  clip_high: float | None = None  # > 0
  clip_c: Annotated[float, Range(1, open_low=True)] = 3.0
  agg_mode: str | None = None  # one of AGG_MODES
  loss_scale_factor: float | None = None  # > 0
  entropy_coeff: NonNegativeFloat = 0.001
  use_kl_loss: bool = False
  kl_coef: NonNegativeFloat = 0.0
  kl_type: Annotated[str, OneOf(KL_KINDS)] = "k1"
  distill_teacher: str | None = None  # a run's workdir, a HF directory or a GGUF file
  distill_coef: NonNegativeFloat = 1.0
  ppo_epochs: PositiveInt = 1
  num_minibatches: PositiveInt = 4
  micro_batches: PositiveInt = 1
  shuffle: bool = True
  actor_lr: PositiveFloat = 1e-6
  critic_lr: PositiveFloat = 1e-5
  weight_decay: NonNegativeFloat = 0.01
  moment_dtype: Annotated[str, OneOf(MOMENT_DTYPES)] = "float32"
  grad_clip: PositiveFloat = 1.0
  value_clip: PositiveFloat = 0.5
  critic: Annotated[str, OneOf(("separate", "shared"))] = "separate"
  vf_coef: NonNegativeFloat = 1.0
  recompute_old_logprobs: bool = True
  rollout_correction: Annotated[str, OneOf(ROLLOUT_CORRECTIONS)] = "none"
  rollout_correction_cap: Annotated[float, Range(1)] = 2.0
  positive_advantages_only: bool = False
  filter_strategy: Annotated[str, OneOf(STRATEGIES)] = "top_p"
  filter_value: PositiveFloat = 1.0  # min_p: also <= 1
  filter_metric: Annotated[str, OneOf(FILTER_METRICS)] = "reward_variance"
  filter_type: Annotated[str, OneOf(("largest", "smallest"))] = "largest"
  filter_include_zero: bool = True
  filter_prob_mode: Annotated[str, OneOf(("linear", "softmax"))] = "linear"
  filter_eps: NonNegativeFloat = 0.01
  vocab_chunk: PositiveInt = 8192
  train_vision_tower: bool = False

  def __post_init__(self):
    check_fields(self, "ppo")
    optional = (
        ("loss_scale_factor", PositiveFloat),
        ("clip_low", losses.POLICY_LOSS_MODES[self.policy_loss].clip_low_type),
        ("clip_high", PositiveFloat),
        ("agg_mode", Annotated[str, OneOf(AGG_MODES)]),
    )
    for name, kind in optional:
      if getattr(self, name) is not None:
        check_value(f"ppo.{name}", getattr(self, name), kind)

    def check(ok, msg):
      if not ok:
        raise ValueError(f"ppo.{msg}")

    check(
        self.distill_teacher is None
        or (isinstance(self.distill_teacher, str) and self.distill_teacher.strip()),
        f"distill_teacher must be a path (a run's workdir, a Hugging Face directory or a GGUF "
        f"file) or None, got {self.distill_teacher!r}",
    )

    if self.adv_estimator == "gigpo":
      ignored = [f"ppo.{f}" for f in CRITIC_FIELDS if getattr(self, f) != _DEFAULTS[f]]
      if ignored:
        logging.warning(
            "ppo.adv_estimator='gigpo' has no critic; these settings are ignored: %s "
            "(its discount is ppo.gigpo_gamma)",
            ", ".join(ignored),
        )
    check(
        self.rollout_correction == "none" or self.recompute_old_logprobs,
        f"rollout_correction={self.rollout_correction!r} needs ppo.recompute_old_logprobs=True: "
        "without it the old log-probs are the sampler's and every ratio is 1",
    )
    check(
        not (
            self.filter_strategy == "top_p"
            and self.filter_prob_mode == "linear"
            and self.filter_type == "smallest"
        ),
        "top_p in linear mode supports filter_type='largest' only",
    )
    if self.filter_strategy == "min_p":
      check(
          self.filter_value <= 1.0,
          f"filter_value must lie in (0, 1] for min_p, got {self.filter_value}",
      )

  @staticmethod
  def in_force(values: dict) -> dict:
    """A stored or command `ppo` section (plain values) with clip_low, clip_high and agg_mode
    as its policy loss uses them: a run saved with 0.2 explicitly and one leaving it to "ppo"'s
    default train alike (config/drift.py compares these)."""
    mode = losses.POLICY_LOSS_MODES[values.get("policy_loss", "ppo")]
    settings = mode.settings(
        values.get("clip_low"), values.get("clip_high"), None, values.get("agg_mode")
    )
    return dict(
        values, clip_low=settings.clip_low, clip_high=settings.clip_high, agg_mode=settings.agg_mode
    )

  @property
  def policy(self) -> losses.PolicySettings:
    """The policy loss's settings, each None replaced by its mode's default."""
    mode = losses.POLICY_LOSS_MODES[self.policy_loss]
    return mode.settings(self.clip_low, self.clip_high, self.clip_c, self.agg_mode)

  @property
  def distills(self):
    """Whether a teacher scores the student's tokens (algos.distill)."""
    return self.distill_teacher is not None

  @property
  def uses_critic(self):
    return self.adv_estimator in CRITIC_ESTIMATORS

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


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PPOConfig)}
