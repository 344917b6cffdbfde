"""Time per turn of the rollout with images against the same rollout as text, in one run.

    python -m experiments.bench.vision [--config configs/visual_sokoban_ppo.py] [--iters 5]
        [--tower_reps 20] [--prompt 640]

The config's environment (visual Sokoban: the text game, each turn's prompt opening with its
84x84 frame, 9 image tokens) played by a random `tiny-vl` (Qwen2.5-VL) against the same game as
text (`sokoban`, the same levels, rules and text, no image) played by a random text model of the
same decoder (tiny-vl's sizes and vocabulary, `model_type="qwen2"`, no tower), both with the
config's training rollout (batch, turns, tokens a reply). Each side plays one rollout to compile,
then `--iters` on new levels; printed, their medians:
  * seconds a turn (the rollout's wall time over the turns played), the policy's share of it
    (`decode_s`: every turn's tower, prefill and decode loop), prompt tokens and sampled tokens
    a turn;
  * the tower alone: `rollout.images.frame_features` (the jitted call the rollout makes each
    turn) on one turn's frames, all the batch's rows, median of `--tower_reps` calls after one
    to compile, and its share of an image turn;
  * the decode loop alone (`sampling.py`'s `decode_step_ms`: ms a decode step at the rollout's
    batch after a `--prompt`-token prompt of text), which tells the decode step's own cost (the
    M-RoPE positions and rope delta a Qwen2.5-VL decoder carries) from the rest of a turn's;
  * one GRPO train step (the config's `ppo`) on each side's last batch: with images every
    forward of the update runs the frames of each row through the tower and splices them
    (rollout.images, algos.step_losses); `--iters` steps after one to compile.
The ratios (images over text) are the figures BENCHMARKS.md records.
"""

import argparse
import statistics
import time

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench import sampling as sampling_bench
from ragen_jax import algos
from ragen_jax import envs
from ragen_jax import models
from ragen_jax import rollout as rollout_lib
from ragen_jax import tokenizers
from ragen_jax.config import cli
from ragen_jax.config import schema
from ragen_jax.rollout import images
from ragen_jax.train import batching


def play(engine, model, iters):
  """(last result, medians of s a turn, decode s a turn, prompt and sampled tokens a turn)."""
  policy = rollout_lib.ModelPolicy(model)
  engine.run(policy, jax.random.key(0), seed=1_000_000)  # compiles
  per_turn, decode, prompt, sampled = [], [], [], []
  for i in range(iters):
    tic = time.perf_counter()
    result = engine.run(policy, jax.random.key(i + 1), seed=1_000_000 + 100 * (i + 1))
    seconds = time.perf_counter() - tic
    turns = int(np.max(result.metrics["num_turns"]))  # the batch plays its turns in lockstep
    s = result.summary
    per_turn.append(seconds / turns)
    decode.append(s["decode_s"] / turns)
    prompt.append((s["prefill_tokens_append"] + s["prefill_tokens_reencode"]) / turns)
    sampled.append(s["generated_tokens"] / turns)
  medians = [statistics.median(x) for x in (per_turn, decode, prompt, sampled)]
  return (result, *medians)


def tower_s(model, frames_BxHxWx3, reps):
  """Median seconds of the rollout's jitted tower call on one turn's frames (the B rows')."""
  graphdef, params = nnx.split(model)
  images.frame_features(graphdef, params, frames_BxHxWx3).block_until_ready()  # compiles
  times = []
  for _ in range(reps):
    tic = time.perf_counter()
    images.frame_features(graphdef, params, frames_BxHxWx3).block_until_ready()
    times.append(time.perf_counter() - tic)
  return statistics.median(times)


def step_s(model, ppo, batch, pad_id, iters):
  """Median seconds of one jitted, donated train step on `batch` (varied scores: every group
  trains), after one to compile."""
  batch = batching.join_batches([batch], 64, pad_id)
  groups = np.asarray(batch.scores_B).shape[0]
  batch = batch.replace(scores_B=np.linspace(0.0, 1.0, groups, dtype=np.float32))
  width = algos.response_width(batch.loss_mask_BxT)
  batch = jax.tree.map(jnp.asarray, batch)
  state = algos.init_train_state(model, None, ppo, jax.random.key(1))
  step = algos.make_train_step(model, None, ppo)
  times = []
  for i in range(iters + 1):
    tic = time.perf_counter()
    state, metrics = step(state, batch, jax.random.key(i), response_width=width)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - tic)
  return statistics.median(times[1:])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/visual_sokoban_ppo.py")
  parser.add_argument("--iters", type=int, default=5)
  parser.add_argument("--tower_reps", type=int, default=20)
  parser.add_argument("--prompt", type=int, default=640)
  args = parser.parse_args()

  exp = schema.from_config(cli.load_config_file(args.config))
  spec = exp.envs[0]
  config = spec.rollout_config(exp.rollout, validation=False)
  visual_env = spec.make()
  text_options = {k: v for k, v in spec.options if k != "cell_px"}
  text_env = envs.make(spec.name.removeprefix("visual_"), **text_options)  # its text game
  tok = tokenizers.load(exp.model.tokenizer)
  vl = models.create(exp.model.preset, jax.random.key(0))
  text = models.create(vl.config.replace(model_type="qwen2", vision=None), jax.random.key(0))
  print(
      f"jax {jax.__version__} on {jax.devices()[0].device_kind}; {args.config}: "
      f"{config.env_groups * config.group_size} episodes of {spec.tag} against "
      f"{text_env.name}, up to {config.max_turns} turns of {config.max_new_tokens} tokens; "
      f"{exp.model.preset} ({models.num_params(vl.config):,} parameters) against its decoder "
      f"alone ({models.num_params(text.config):,})"
  )
  rows = {}
  for name, env, model in (("images", visual_env, vl), ("text", text_env, text)):
    engine = rollout_lib.Rollout(env, tok, config)
    rows[name] = play(engine, model, args.iters)
    engine.close()
  result = rows["images"][0]
  frames_BxHxWx3 = result.frames_KxBxHxWx3[0]
  tower = tower_s(vl, frames_BxHxWx3, args.tower_reps)
  batch = config.env_groups * config.group_size
  decode_ms = {
      name: sampling_bench.decode_step_ms(model, batch, args.prompt)
      for name, model in (("images", vl), ("text", text))
  }
  steps = {
      name: step_s(model, exp.ppo, rows[name][0].batch, tok.pad_id, args.iters)
      for name, model in (("images", vl), ("text", text))
  }
  print(
      "side   | s/turn | decode s/turn | prompt tok/turn | sampled tok/turn | decode step ms "
      "| train step s"
  )
  for name, (_, per_turn, decode, prompt, sampled) in rows.items():
    print(
        f"{name:6s} | {per_turn:6.3f} | {decode:13.3f} | {prompt:15.0f} | {sampled:16.0f} | "
        f"{decode_ms[name]:14.1f} | {steps[name]:.3f}"
    )
  image_turn, text_turn = rows["images"][1], rows["text"][1]
  print(
      f"images/text: s a turn {image_turn / text_turn:.2f}x, decode a turn "
      f"{rows['images'][2] / rows['text'][2]:.2f}x, decode step "
      f"{decode_ms['images'] / decode_ms['text']:.2f}x, train step "
      f"{steps['images'] / steps['text']:.2f}x"
  )
  print(
      f"tower on one turn's {frames_BxHxWx3.shape[0]} frames: {tower * 1e3:.1f} ms, "
      f"{tower / image_turn:.1%} of an image turn, {tower / (image_turn - text_turn):.0%} of "
      "its time over a text turn"
  )


if __name__ == "__main__":
  main()
