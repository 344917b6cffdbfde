"""Supervised fine-tuning on scripted demonstrations: the warm start of a tiny policy.

    model, metrics = sft.finetune(model, engines, sft_config, log=...)  # engines: {name: Rollout}

Demonstrations come from `Rollout.run_scripted` with the experts of `ragen_jax.warm_start.demos`,
so they hold exactly the token layout a rollout produces (system prompt, user turns, reward
lines, replies after the generation prefix). The loss is the mean negative log-likelihood of
the reply tokens (`loss_mask_BxT`), the prompts being context only. One jitted, donated step;
sequences are padded to a multiple of `pad_multiple` so a run compiles a handful of shapes.

Demonstrations of a visual environment keep each row's frames (`RolloutBatch.frames_BxNxHxWx3`)
and the step splices them into the image tokens with the update's own forward
(`step_losses.hidden_states`), so a Qwen2.5-VL policy is fine-tuned on what it will see. The
vision tower trains only where the update trains it (`ppo.train_vision_tower`, `warm_start`):
one switch for the run, so the warm start never moves weights that reinforcement learning then
holds fixed.

Dimensions: B sequences per batch, T tokens, N frames a row, H x W x 3 a frame.
"""

import dataclasses
import time
from typing import Any, Callable, Dict, List, Optional

from absl import logging
import flax
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ragen_jax import rollout as rollout_lib
from ragen_jax.algos import optim
from ragen_jax.algos import step_losses
from ragen_jax.algos.logprobs import sequence_logprobs
from ragen_jax.config_checks import check_fields, NonNegativeFloat, NonNegativeInt
from ragen_jax.config_checks import PositiveFloat, PositiveInt, UnitFloat
from ragen_jax.models import lora
from ragen_jax.models.build import copy_tree
from ragen_jax.warm_start import demos
from ragen_jax import keys


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  """Fine-tuning knobs (validated here; the config file's `sft` section maps onto them)."""

  steps: NonNegativeInt = 0  # optimizer steps (0 = no warm start)
  batch_size: PositiveInt = 16  # sequences per step
  lr: PositiveFloat = 1e-3  # AdamW peak learning rate (linear warm-up, cosine decay)
  warmup_steps: NonNegativeInt = 20
  weight_decay: NonNegativeFloat = 0.0
  grad_clip: PositiveFloat = 1.0
  random_prob: UnitFloat = 0.25  # share of demonstration actions replaced by random ones
  undo_prob: UnitFloat = 0.0  # share of two-action replies that take back their first move
  seed: NonNegativeInt = 1000000  # first level seed of the demonstrations (apart from train/val)
  pad_multiple: PositiveInt = 128  # sequences are padded to a multiple of this

  def __post_init__(self):
    check_fields(self, "sft")


@flax.struct.dataclass
class SFTState:
  params: Any
  opt: Any
  step: jax.Array


def _optimizer(cfg: SFTConfig):
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, cfg.lr, max(cfg.warmup_steps, 1), max(cfg.steps, cfg.warmup_steps + 1), cfg.lr * 0.1
  )
  # float32 moments whatever the parameters' dtype (optax.adamw's would follow bfloat16 ones).
  return optax.chain(
      optax.clip_by_global_norm(cfg.grad_clip), optim.adamw(schedule, weight_decay=cfg.weight_decay)
  )


def make_sft_step(model, cfg: SFTConfig, train_tower: bool = False):
  """(init(params) -> SFTState, step(state, tokens_BxT, attn_BxT, loss_BxT, frames) ->
  (state, metrics)). `frames`: uint8 [B, N, H, W, 3], each row's images (a visual
  environment's rows), or None; with `train_tower` the vision tower is fine-tuned too."""
  graphdef, _, rest = nnx.split(model, nnx.Param, ...)
  tx = _optimizer(cfg)

  def nll(params, tokens, attn, loss_mask, frames):
    m = nnx.merge(graphdef, params, rest)
    hidden_BxTxD = step_losses.hidden_states(m, tokens, attn, frames, train_tower)
    logp, _ = sequence_logprobs(
        hidden_BxTxD,
        m.unembed_kernel().astype(hidden_BxTxD.dtype),
        tokens,
        with_entropy=False,
        excluded_ids=m.config.excluded_token_ids,
    )
    maskf = loss_mask.astype(jnp.float32)
    n = jnp.maximum(jnp.sum(maskf), 1.0)
    return -jnp.sum(logp * maskf) / n, jnp.sum(jnp.exp(logp) * maskf) / n

  def step(state: SFTState, tokens, attn, loss_mask, frames=None):
    # With LoRA adapters only they are fine-tuned (RAGEN's LoRA SFT): the base stays frozen.
    trainable, frozen = lora.partition(state.params)
    loss_of = lambda t: nll(lora.combine(t, frozen), tokens, attn, loss_mask, frames)
    (loss, mean_p), grads = jax.value_and_grad(loss_of, has_aux=True)(trainable)
    updates, opt = tx.update(grads, state.opt, trainable)
    stepped = optax.apply_updates(trainable, updates)
    params = lora.combine(step_losses.keep_frozen_tower(stepped, trainable, train_tower), frozen)
    metrics = {"sft/loss": loss, "sft/token_prob": mean_p, "sft/grad_norm": optax.tree.norm(grads)}
    return SFTState(params, opt, state.step + 1), metrics

  def init(params):
    return SFTState(params, tx.init(lora.partition(params)[0]), jnp.zeros((), jnp.int32))

  return init, jax.jit(step, donate_argnums=(0,))


def pad_to_multiple(x_BxT: np.ndarray, multiple: int, value) -> np.ndarray:
  """Left-pads the time axis (sequences are left-padded already) to a multiple of `multiple`."""
  t = x_BxT.shape[1]
  extra = -t % multiple
  return np.pad(x_BxT, ((0, 0), (extra, 0)), constant_values=value) if extra else x_BxT


def batch_schedule(weights: Dict[str, int]) -> List[str]:
  """One round of the demonstration mix: each environment `weights[name]` times, interleaved
  (weights {a: 3, b: 1} give [a, b, a, a]) so no environment is absent for long."""
  return [name for k in range(max(weights.values())) for name, w in weights.items() if w > k]


def pad_frames(frames_NxHxWx3: np.ndarray, n: int) -> np.ndarray:
  """A row's frames to `n` (a static count), the last repeated: the forward ignores frames
  past a row's images, as it does the rollout's (`rollout.images`, `attach`)."""
  extra = n - frames_NxHxWx3.shape[0]
  return np.pad(frames_NxHxWx3, ((0, extra), (0, 0), (0, 0), (0, 0)), mode="edge")


class DemoStream:
  """Endless demonstration batches, each from one environment (so it is padded only to that
  environment's lengths), cycling through `batch_schedule(weights)` (default: one each).

  A batch is [tokens_BxT, attn_BxT, loss_BxT, frames]: `frames` uint8 [B, N, H, W, 3] for a
  visual environment (N its `max_turns`, the most images a row shows, so shapes stay fixed),
  else None.
  """

  def __init__(
      self,
      engines: Dict[str, Any],
      cfg: SFTConfig,
      pad_id: int,
      weights: Optional[Dict[str, int]] = None,
  ):
    self.engines, self.cfg, self.pad_id = engines, cfg, pad_id
    self.schedule = batch_schedule(weights or {name: 1 for name in engines})
    if set(self.schedule) != set(engines):
      raise ValueError(
          f"SFT weights name {sorted(set(self.schedule))}, the environments are "
          f"{sorted(engines)}; every environment needs a weight >= 1"
      )
    self.policies = {
        name: demos.expert_policy(e.env, e.config, cfg.random_prob, cfg.seed + i, cfg.undo_prob)
        for i, (name, e) in enumerate(engines.items())
    }
    self.buffers = {name: [] for name in engines}
    self.rounds = {name: 0 for name in engines}
    self.calls, self.stats = 0, {}

  def _refill(self, name: str):
    engine, r = self.engines[name], self.rounds[name]
    seed = keys.demo_level_seed(self.cfg.seed, r, engine.config.env_groups)
    result = engine.run_scripted(self.policies[name], jax.random.key(seed), seed)
    b = result.batch
    tokens, attn, loss = (
        np.asarray(x) for x in (b.tokens_BxT, b.attention_mask_BxT, b.loss_mask_BxT)
    )
    frames = [None] * len(tokens) if b.frames_BxNxHxWx3 is None else np.asarray(b.frames_BxNxHxWx3)
    rows = [
        (tokens[i, -n:], attn[i, -n:], loss[i, -n:], frames[i])  # without the left padding
        for i, n in enumerate(attn.sum(axis=1))
        if b.row_episodes_R is None or loss[i].any()  # a window's rows of unplayed turns: none
    ]
    order = np.random.default_rng(seed).permutation(len(rows))
    self.buffers[name].extend(rows[i] for i in order)
    self.stats[f"sft/{name}/demo_success"] = result.summary["success"]
    self.rounds[name] = r + 1

  def next(self):
    name = self.schedule[self.calls % len(self.schedule)]
    self.calls += 1
    while len(self.buffers[name]) < self.cfg.batch_size:
      self._refill(name)
    rows = self.buffers[name][: self.cfg.batch_size]
    self.buffers[name] = self.buffers[name][self.cfg.batch_size :]
    width = max(len(r[0]) for r in rows)
    width += -width % self.cfg.pad_multiple
    batch = [
        np.stack([np.pad(r[k], (width - len(r[k]), 0), constant_values=value) for r in rows])
        for k, value in ((0, self.pad_id), (1, 0), (2, 0))
    ]
    n = self.engines[name].config.max_turns
    return batch + [None if rows[0][3] is None else np.stack([pad_frames(r[3], n) for r in rows])]


def finetune(
    model,
    engines: Dict[str, Any],
    cfg: SFTConfig,
    log: Optional[Callable[[int, Dict[str, float]], None]] = None,
    log_every: int = 20,
    weights: Optional[Dict[str, int]] = None,
    train_tower: bool = False,
):
  """Fine-tunes a copy of `model` on expert demonstrations; returns (model, last metrics).
  `weights[name]`: batches of that environment per round of the mix (DemoStream);
  `train_tower`: a Qwen2.5-VL's vision tower is fine-tuned too (else frozen)."""
  if cfg.steps == 0:
    return model, {}
  init, step = make_sft_step(model, cfg, train_tower)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  state = init(copy_tree(nnx.to_pure_dict(params)))
  stream = DemoStream(engines, cfg, next(iter(engines.values())).tok.pad_id, weights)
  start, metrics = time.perf_counter(), {}
  for i in range(cfg.steps):
    state, metrics = step(state, *stream.next())
    if log is not None and ((i + 1) % log_every == 0 or i + 1 == cfg.steps):
      metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
      metrics.update(stream.stats, **{"sft/elapsed_s": time.perf_counter() - start})
      log(i + 1, metrics)
  return (
      nnx.merge(graphdef, state.params, rest),
      {k: float(v) for k, v in jax.device_get(metrics).items()},
  )


def warm_start(
    model,
    exp,
    tokenizer,
    sharder=None,
    log: Optional[Callable[[int, Dict[str, float]], None]] = None,
):
  """The run's starting point: `model` fine-tuned for `exp.sft.steps` steps (unchanged for 0).

  Each tag plays one episode per level (demonstrations cover as many levels as possible), and
  a round of the mix holds `envs.<tag>.sft_batches` batches of that tag. A visual tag's
  demonstrations carry their frames; the tower trains as the update's (`ppo.train_vision_tower`).
  """
  if not exp.sft.steps:
    return model
  engines = {}
  for spec in exp.envs:
    rc = spec.rollout_config(exp.rollout, validation=False)
    rc = dataclasses.replace(rc, env_groups=rc.env_groups * rc.group_size, group_size=1)
    engines[spec.tag] = rollout_lib.Rollout(spec.make(), tokenizer, rc, sharder)
  weights = {spec.tag: spec.sft_batches for spec in exp.envs}
  logging.info(
      "warm start: %d steps of supervised fine-tuning on expert demonstrations "
      "(%.0f%% random actions, %.0f%% of two-action replies taking back their first "
      "move; batches per round %s)",
      exp.sft.steps,
      100 * exp.sft.random_prob,
      100 * exp.sft.undo_prob,
      weights,
  )
  model, _ = finetune(
      model, engines, exp.sft, weights=weights, log=log, train_tower=exp.ppo.train_vision_tower
  )
  return model
