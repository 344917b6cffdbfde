"""The StarPO training loop: rollout, filter + update, validation, logging, checkpoints.

    from ragen_jax.train import trainer
    summary = trainer.train(config, workdir)     # config: configs/*.py ConfigDict

Per step s = 1 .. total_steps: every environment tag plays `train_groups x group_size` episodes
from the levels of seeds `seed.train + (s - 1) * G + offset` (G groups per step, RAGEN's
counter; with `rollout.dynamic_sampling`, refill rounds of other levels replace the groups
without reward spread: train/dynamic_sampling.py), the batches are joined (one sequence per
episode, padded to a multiple of `trainer.pad_multiple`), and one compiled, donated `algos`
train step filters and updates.
Validation (step 0 = the starting point, then every `eval_every` steps) plays the fixed seeds
`seed.val + g` at the validation temperature. All randomness derives from (seed.init, step), so
a resumed run replays exactly what the uninterrupted run would have done.

Diagnostics (ragen_jax.diagnostics): every step the valid-thinking rate and reasoning lengths;
at step 1 and every `diagnostics.compute_freq` steps RAGEN-2's MI family (`collapse/*`), on the
unfiltered batch under the policy that sampled it, before the update. RAGEN's stopping rules
(diagnostics.early_stop) watch every step and validation; a rule in "stop" mode saves and ends
the run, and running the command again reports that instead of training on.

Workdir: `checkpoints/<step>/` (orbax: actor, critic, optimizer states, step, base key; JSON
meta with the config, seed counters, stopping-rule streaks and the MI z-score EMA), TensorBoard
events (and the W&B and MLflow runs the `logging` section enables, their ids in `trackers.json`
so that a resumed run continues them; ragen_jax.trackers), `eval/step_<s>.jsonl` trajectories
and their pages `viewer/step_<s>.html` (ragen_jax.viewer), and `config.json`, the config the
run goes on under, written once the config, the mesh and any resume have passed their checks.
Running again resumes from the latest checkpoint; a config that differs from the checkpoint's in
keys outside `drift.MAY_CHANGE` is refused (ConfigError) before anything runs, unless the caller
allows the change. A non-finite loss stops the run (nothing is saved), and so does a rollout in
which more episodes than `envs.<tag>.max_env_errors` ended in an environment fault (before
training on them; train/guards.py). Ctrl-C or SIGTERM finishes the current step, saves and returns
(`stop_signals`; during start-up it stops at once, nothing having been trained).

Each step's batch comes from a collector (train/collectors.py), chosen once: played when the
step asks for it, or, with `trainer.async_rollout`, the rollout of step s+1 played on
`mesh.rollout_devices` while step s trains on the other devices (train/pipeline.py: staleness,
weight copies, exact resumes). Every "every N steps" event follows one rule, `due`.

Multi-process runs (ragen_jax.distributed) execute this same loop on every process: each plays
its share of every rollout, after which every process holds the same episodes, metrics and
training batch, so every decision (stopping rules, stop signals, saves) is taken identically
everywhere. Process 0 alone writes events (and logs to the trackers), trajectories, pages and
config.json; all take part in checkpoints.
"""

import json
import os
import time
from typing import Any, Dict, Optional

from absl import logging
import jax
import ml_collections

from ragen_jax import algos
from ragen_jax import atomic_write
from ragen_jax import checkpoints
from ragen_jax import diagnostics
from ragen_jax import distributed
from ragen_jax import keys
from ragen_jax import logging_utils
from ragen_jax import rollout as rollout_lib
from ragen_jax import sharding
from ragen_jax import trackers
from ragen_jax.config import drift
from ragen_jax.config import schema
from ragen_jax.train import batching
from ragen_jax.train import collectors
from ragen_jax.train import dynamic_sampling
from ragen_jax.train import guards
from ragen_jax.train import memory
from ragen_jax.train import pipeline
from ragen_jax.train import policy as policy_lib
from ragen_jax.train import run_state
from ragen_jax.train import stop_signals
from ragen_jax.train import teacher as teacher_lib
from ragen_jax.train import validation
from ragen_jax.warm_start import sft as sft_lib

# What stops a run (train/guards.py), raised from here.
NonFiniteLossError = guards.NonFiniteLossError
EnvironmentFailure = guards.EnvironmentFailure


class ConfigError(ValueError):
  """The command's config cannot run: a bad value (schema.from_config), a mesh the devices
  do not fit, a model that does not see its environments' kind (`schema.check_images`), or a
  change from the config the workdir's checkpoints were trained under."""


def _config_json(config, indent=None) -> str:
  if isinstance(config, ml_collections.ConfigDict):
    return config.to_json_best_effort(indent=indent)
  return "{}"


def train(
    config,
    workdir: str,
    stop_after: Optional[int] = None,
    allow_config_change: bool = False,
) -> Dict[str, Any]:
  """Runs (or resumes) the experiment `config` in `workdir`; returns the last metrics.

  Args:
    config: the experiment ConfigDict (validated here by schema.from_config).
    workdir: run directory (created); an existing checkpoint there is resumed.
    stop_after: stop (saving a checkpoint) after this many steps of this call, as if
      interrupted; for tests of resumption.
    allow_config_change: resume even when `config` differs from the config the latest
      checkpoint was trained under in keys outside `drift.MAY_CHANGE` (each change is
      logged as a warning); without it such a resume raises ConfigError before anything runs.

  Returns:
    The last step's metrics with "step"; "interrupted": True when a signal stopped the run.
  """
  # One process alone may abort its start-up; several must reach a collective check together.
  with stop_signals.StopFlag(abort_start_up=not distributed.multiprocess()) as stop:
    ckpt = None
    try:
      exp = _as_config_error(schema.from_config, config)
      sharders = _as_config_error(_mesh, exp)
      _as_config_error(lambda: schema.check_images(exp, policy_lib.model_config(exp)))
      ckpt = checkpoints.Checkpointer(
          os.path.join(workdir, "checkpoints"), keep=exp.trainer.keep_checkpoints
      )
      refusal = drift.check_resume(ckpt, _config_json(config), allow_config_change)
      if refusal:
        raise ConfigError(refusal)
      os.makedirs(workdir, exist_ok=True)
      # TensorBoard, and W&B and MLflow when `logging` enables them: one writer the loop calls.
      writer = _as_config_error(
          trackers.open_trackers,
          exp.logging,
          workdir,
          json.loads(_config_json(config)),
          ckpt.latest_step() is not None,
          jax.process_index() == 0,
      )
      with writer:
        run = None
        try:
          run = Trainer(exp, config, workdir, writer, ckpt, *sharders)
          return run.loop(stop, stop_after)
        finally:
          if run is not None:
            run.close()
    except stop_signals.StartUpInterrupted as e:
      step = None if ckpt is None else ckpt.latest_step()
      logging.warning(
          "%s during start-up: stopped before training (latest checkpoint: %s); run the same "
          "command to resume",
          e,
          "none" if step is None else f"step {step}",
      )
      return {"step": step, "interrupted": True}
    finally:
      if ckpt is not None:
        ckpt.close()


def _mesh(exp) -> tuple[sharding.Sharder, Optional[sharding.Sharder]]:
  """The training mesh and (trainer.async_rollout) the rollout devices' mesh, with every size
  they must divide checked before anything compiles."""
  devices, rollout = distributed.mesh_devices(), None
  if exp.trainer.async_rollout:
    if distributed.multiprocess():
      raise ValueError(
          f"trainer.async_rollout=True runs on one process only: splitting the devices of "
          f"{jax.process_count()} processes into rollout and training meshes "
          "(mesh.rollout_devices) is not supported yet; set trainer.async_rollout=False"
      )
    rollout_devices, devices = sharding.split_devices(exp.mesh, jax.devices())
    rollout = sharding.Sharder(exp.mesh.rollout_spec(), devices=rollout_devices)
    rollout.check_model(policy_lib.model_config(exp))
    for e in exp.envs:
      rollout.check_batch(
          f"the rollout batch of envs.{e.tag} on mesh.rollout_devices = "
          f"{len(rollout_devices)} (train_groups x rollout.group_size)",
          e.train_groups * exp.rollout.group_size,
      )
  sharder = sharding.Sharder(exp.mesh, devices=devices)
  logging.info(
      "mesh %s over %d devices (%d processes)",
      dict(sharder.mesh.shape),
      jax.device_count(),
      jax.process_count(),
  )
  sharder.check_batch("the training batch (episodes per step)", exp.train_episodes)
  return sharder, rollout


def _as_config_error(fn, *args):
  """fn(*args), its ValueError (a message naming the key) raised as ConfigError."""
  try:
    return fn(*args)
  except ValueError as e:
    raise ConfigError(str(e)) from e


def _write_config_record(workdir: str, config) -> None:
  """`workdir/config.json`: the config the run trains under (process 0), replaced atomically."""
  if jax.process_index() == 0:
    atomic_write.write_text(os.path.join(workdir, "config.json"), _config_json(config, indent=1))


def due(step: int, every: int, total: int | None = None, *, first: bool = False) -> bool:
  """Whether an "every N steps" event falls at `step`: each `every`-th step, the last one
  (`total`, when given) and step 1 (when `first`); `every` 0: never. The one cadence rule of the
  loop (big_vision's `itstime`): validation and saving end on the last step, the collapse
  diagnostics start at step 1 (RAGEN-2's baseline before any update)."""
  return bool(every) and (step % every == 0 or step == total or (first and step == 1))


class Trainer:
  """One call of `train`: builds the model, the engines and the collector, then loops."""

  def __init__(self, exp, config, workdir, writer, ckpt, sharder, rollout_sharder=None):
    self.exp, self.workdir, self.writer, self.ckpt = exp, workdir, writer, ckpt
    self.config = config
    self.sharder = sharder
    self.model, self.tok = policy_lib.build(exp, self.sharder)
    # The distillation teacher, refused here (before anything trains) if its tokenizer differs.
    teacher_model, self.teacher_params = None, None
    if exp.ppo.distills:
      teacher_model, self.teacher_params = _as_config_error(
          teacher_lib.load, exp, self.tok, self.sharder
      )
    estimate = memory.estimate(
        exp,
        self.model.config,
        self.sharder,
        teacher_config=None if teacher_model is None else teacher_model.config,
    )
    logging.info("%s", memory.describe(estimate, memory.device_bytes()))
    self.engines = {
        e.tag: rollout_lib.Rollout(
            e.make(),
            self.tok,
            e.rollout_config(exp.rollout, validation=False),
            rollout_sharder or self.sharder,
        )
        for e in exp.envs
    }
    self.val_engines = validation.engines(exp, self.tok, self.sharder)
    self.state_shape = jax.eval_shape(
        lambda: run_state.new_state(self.model, exp.ppo, jax.random.key(0))
    )
    self.state_sharding = self.sharder.tree(self.state_shape)
    self.train_step = algos.make_train_step(
        self.model,
        None,
        exp.ppo,
        out_shardings=(self.state_sharding.train, self.sharder.replicated),
        temperature=exp.rollout.temperature,
        teacher_model=teacher_model,
    )
    self.host = run_state.HostState.new(exp)
    # Where each step's batch comes from: played when the step asks, or (async) one step ahead
    # on the rollout devices.
    if rollout_sharder is None:
      self.collector = collectors.Synchronous(self.engines, exp, self.model)
    else:
      self.collector = pipeline.OneStepAhead(self.engines, exp, self.model, rollout_sharder)

  def close(self):
    """Ends the text environments' pools (threads, worker processes)."""
    for engine in (*self.engines.values(), *self.val_engines.values()):
      engine.close()

  # ------------------------------------------------------------------ state

  def _fresh_state(self) -> run_state.RunState:
    """The starting point: the SFT warm start (if configured), then a new TrainState."""
    self.model = sft_lib.warm_start(
        self.model,
        self.exp,
        self.tok,
        self.sharder,
        log=lambda i, m: (self.writer.scalars(i, m), logging.info("sft step %d: %s", i, _fmt(m))),
    )
    state = distributed.put(
        run_state.new_state(self.model, self.exp.ppo, keys.base(self.exp.seed)), self.state_sharding
    )
    self.collector.start(self.model, state)
    return state

  def _restore(self) -> tuple[run_state.RunState, int]:
    like = self.collector.restore_target(run_state.placed(self.state_shape, self.state_sharding))
    # Arrays restored straight into their shardings; a checkpoint of another model or optimizer
    # (a change allowed explicitly) does not fit this config.
    restored, meta = _as_config_error(self.ckpt.restore, like)
    self.host = run_state.HostState.from_meta(self.exp, meta)
    state = distributed.put(self.collector.restored(restored, self.host), self.state_sharding)
    logging.info("resumed from %s at step %d", self.ckpt.directory, int(meta["step"]))
    return state, int(meta["step"])

  def _save(self, state: run_state.RunState, step: int):
    saved = self.collector.checkpoint(state, self.host)
    self.ckpt.save(step, saved, self.host.meta(self.exp, step, _config_json(self.config)))

  # ------------------------------------------------------------------ pieces of a step

  def _policy(self, state: run_state.RunState):
    return algos.actor_module(self.model, state.train)

  def _inspect(self, policy, results, step: int) -> Dict[str, float]:
    """Checks a step's batch for environment faults, then diagnoses it under `policy`, the
    policy that played it."""
    shares = {tag: (r.summary["env_error"], r.episodes) for tag, r in results.items()}
    guards.check_env_errors(self.exp.envs, shares, step, self.ckpt)
    return self._diagnose(policy, results, step)

  def _step(self, state: run_state.RunState, step: int):
    """One training step: (the state after it, its metrics, the host batch it trained on)."""
    taken = self.collector.take(
        state, step, lambda policy, results: self._inspect(policy, results, step)
    )
    # Built on the host once; every process holds it whole and places the rows its devices hold.
    host_batch = batching.join_batches(
        [r.batch for r in taken.results.values()], self.exp.trainer.pad_multiple, self.tok.pad_id
    )
    batch = distributed.put(host_batch, self.sharder.batch_tree(host_batch))
    tic_update = time.perf_counter()
    train_state, metrics = self.train_step(
        state.train,
        batch,
        keys.update(keys.step(state.key, step)),
        response_width=algos.response_width(host_batch.loss_mask_BxT),
        teacher_params=self.teacher_params,
    )  # dispatched: what the collector does now overlaps the update
    self.collector.after_dispatch(step)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    t_update = time.perf_counter() - tic_update
    guards.check_losses(metrics, step, self.ckpt)
    metrics.update(
        batching.rollout_metrics(taken.results, "train"),
        **batching.rollout_cost(taken.results),
        **taken.diagnostics,
        **batching.batch_metrics(host_batch),
        **{"timing_s/gen": taken.seconds, "timing_s/update": t_update},
        **taken.metrics,
        **dynamic_sampling.metrics(taken.results),
    )
    self.host.episodes_played += int(metrics["rollout/episodes_played"])
    metrics["rollout/episodes_played_total"] = float(self.host.episodes_played)
    return state.replace(train=train_state), metrics, host_batch

  def _diagnose(self, policy, results, step: int) -> Dict[str, float]:
    """Reasoning metrics every step; RAGEN-2's MI family when due (on the unfiltered batch,
    under the policy that sampled it, before the update)."""
    if not self.exp.rollout.enable_think:
      return {}
    turns = diagnostics.collect_turns(results, self.tok)
    metrics = diagnostics.step_metrics(turns)
    if due(step, self.exp.diagnostics.compute_freq, first=True):
      tic = time.perf_counter()
      mi, self.host.collapse_ema = diagnostics.compute(
          policy,
          turns,
          self.exp.diagnostics,
          keys.collapse_rng(self.exp.seed, step),
          self.host.collapse_ema,
          pad_id=self.tok.pad_id,
          temperature=self.exp.rollout.temperature,
          frames=diagnostics.step_frames(results),  # a visual environment's prompts' frames
      )
      metrics.update(mi)
      metrics["timing_s/collapse_metrics"] = time.perf_counter() - tic
    return metrics

  def _validate(self, state: run_state.RunState, step: int) -> Dict[str, float]:
    tic = time.perf_counter()
    model_policy = rollout_lib.ModelPolicy(self._policy(state))
    metrics, episodes = validation.run(self.exp, self.val_engines, model_policy)
    metrics["timing_s/testing"] = time.perf_counter() - tic
    shares = {
        spec.tag: (
            metrics[f"val/{spec.tag}/env_error"],
            [ep for ep in episodes if ep.env == spec.tag],
        )
        for spec in self.exp.envs
    }
    guards.check_env_errors(self.exp.envs, shares, step, self.ckpt)
    validation.write_outputs(
        self.workdir,
        step,
        episodes,
        self.writer,
        [spec.tag for spec in self.exp.envs],
        self.exp.trainer.sample_trajectories,
    )
    return metrics

  def _start(self, stop: stop_signals.StopFlag) -> tuple[run_state.RunState, int]:
    """The restored state, or the starting point validated (step 0) and saved; then
    `workdir/config.json` records the config the run goes on under."""
    if self.ckpt.latest_step() is not None:
      state, step = self._restore()
      stop.start_up_done()
    else:
      state, step = self._fresh_state(), 0
      val = self._validate(state, 0)
      self.host.stopped = guards.fired(self.host.monitor.after_validation(0, val), val)
      self.writer.scalars(0, val)
      logging.info("step 0 (starting point): %s", _fmt(val))
      stop.start_up_done()  # a signal from here on lets the save finish
      self._save(state, 0)
    _write_config_record(self.workdir, self.config)
    return state, step

  def _ended(self, stop: stop_signals.StopFlag, start: int) -> Optional[Dict[str, Any]]:
    """The summary of a run that goes no further than its start (a signal during start-up or
    step 0's save, or an early stop in "stop" mode); None when it trains on."""
    # A signal during a multi-process start-up, or during step 0's save, stops here.
    if distributed.any_across(stop.requested):
      logging.info("stopped at step %d; run the same command to resume", start)
      return {"step": start, "interrupted": True}
    stopped = self.host.stopped
    if stopped and getattr(self.exp.early_stop, stopped["rule"]) == "stop":
      logging.warning(
          "the run was stopped early at step %d (%s: %s); to continue, set "
          "--config.early_stop.%s=warn or off",
          stopped["step"],
          stopped["rule"],
          stopped["message"],
          stopped["rule"],
      )
      return {"step": start, "early_stopped": stopped["rule"]}
    return None

  # ------------------------------------------------------------------ the loop

  def loop(self, stop: stop_signals.StopFlag, stop_after: Optional[int]) -> Dict[str, Any]:
    total = self.exp.trainer.total_steps
    state, start = self._start(stop)
    ended = self._ended(stop, start)
    if ended:
      return ended
    progress = logging_utils.Progress(
        max(total, 1), start_step=start, enabled=jax.process_index() == 0
    )
    last, step = {}, start
    for step in range(start + 1, total + 1):
      tic = time.perf_counter()
      state, metrics, host_batch = self._step(state, step)
      events = self.host.monitor.after_step(step, metrics)
      if due(step, self.exp.trainer.eval_every, total):
        val = self._validate(state, step)
        metrics.update(val)
        events += self.host.monitor.after_validation(step, val)
      self.host.stopped = stopped = guards.fired(events, metrics)
      metrics["timing_s/step"] = time.perf_counter() - tic
      metrics["perf/throughput"] = (
          float(host_batch.attention_mask_BxT.sum()) / metrics["timing_s/step"]
      )
      self.writer.scalars(step, metrics)
      progress.update(step, metrics)
      last = metrics
      # A signal that reached only some processes still stops them all at the same step.
      interrupted = distributed.any_across(stop.requested) or (
          stop_after is not None and step - start >= stop_after
      )
      if due(step, self.exp.trainer.save_every, total) or interrupted or stopped:
        self._save(state, step)
      if stopped:
        logging.warning("stopping early after step %d (%s)", step, stopped["rule"])
        last["early_stopped"] = stopped["rule"]
        break
      if interrupted:
        logging.info("stopped after step %d; run the same command to resume", step)
        last["interrupted"] = True
        break
    self.writer.flush()
    return {"step": step, **last}


def _fmt(metrics: Dict[str, float]) -> str:
  keys_ = [k for k in sorted(metrics) if k.endswith(("success", "loss", "pass@1"))][:8]
  return ", ".join(f"{k}={metrics[k]:.3g}" for k in keys_)
