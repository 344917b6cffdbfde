"""The experiment config, validated once into typed objects with clear errors.

    exp = experiment.from_config(config)   # config: the ml_collections.ConfigDict of configs/*.py
    exp.envs[0].make()                     # the environment of the first tag
    exp.envs[0].rollout_config(exp.rollout, validation=False)

Everything a run needs is checked here, before any compilation: environment names and options,
render formats, model preset or checkpoint directory, rollout sizes, the StarPO settings
(algos.PPOConfig), the warm start (train.sft.SFTConfig), the trainer's schedule, the collapse
diagnostics (diagnostics.CollapseConfig), the stopping rules (train.early_stop.EarlyStopConfig),
the mesh (sharding.MeshSpec), and that the training batch splits into minibatches and
micro-batches. What depends on the devices present (the mesh's shape, sizes that must divide it)
is checked by `sharding.Sharder` when the run starts, still before anything compiles.
"""
import dataclasses
import os
from typing import Any, Dict, Tuple

from ragen_jax import algos
from ragen_jax import envs
from ragen_jax import models
from ragen_jax import rollout as rollout_lib
from ragen_jax.diagnostics import CollapseConfig
from ragen_jax.envs import base as env_base
from ragen_jax.sharding import MeshSpec
from ragen_jax.train.early_stop import EarlyStopConfig
from ragen_jax.train.sft import SFTConfig

_DTYPES = ("float32", "bfloat16", "float16")


def _fail(msg):
  raise ValueError(f"config: {msg}")


def _positive(section, obj, names, minimum=1):
  for name in names:
    value = getattr(obj, name)
    if not isinstance(value, int) or value < minimum:
      _fail(f"{section}.{name} must be an integer >= {minimum}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """One environment tag: what is played and how many groups per step."""
  tag: str
  name: str
  options: Tuple[Tuple[str, Any], ...]
  val_options: Tuple[Tuple[str, Any], ...]
  render_format: str
  max_actions_per_traj: int
  max_tokens_hint: int
  train_groups: int
  val_groups: int
  sft_batches: int

  def make(self, validation: bool = False):
    options = dict(self.options)
    if validation:
      options.update(self.val_options)
    return envs.make(self.name, **options)

  def rollout_config(self, r: "RolloutSpec", validation: bool) -> rollout_lib.RolloutConfig:
    return rollout_lib.RolloutConfig(
        env_groups=min(self.val_groups, r.val_batch_groups) if validation else self.train_groups,
        group_size=r.val_group_size if validation else r.group_size,
        max_turns=r.max_turns, max_actions_per_turn=r.max_actions_per_turn,
        max_actions_per_traj=self.max_actions_per_traj, action_sep=r.action_sep,
        format_penalty=r.format_penalty, enable_think=r.enable_think,
        unchanged_penalty=0.0 if validation else r.unchanged_penalty,
        max_new_tokens=r.max_new_tokens, max_context=r.max_context,
        max_turn_tokens=r.max_turn_tokens,
        temperature=r.val_temperature if validation else r.temperature,
        top_p=r.top_p, top_k=r.top_k, render_format=self.render_format,
        max_tokens_hint=self.max_tokens_hint, use_turn_scores=r.use_turn_scores)


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
  group_size: int
  max_turns: int
  max_actions_per_turn: int
  action_sep: str
  format_penalty: float
  unchanged_penalty: float
  enable_think: bool
  max_new_tokens: int
  max_context: int
  max_turn_tokens: int
  temperature: float
  top_p: float
  top_k: int
  use_turn_scores: bool
  val_group_size: int
  val_temperature: float
  val_batch_groups: int


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  preset: str
  checkpoint: str | None
  warm_start: bool
  tokenizer: str
  dtype: str
  remat: bool = False


@dataclasses.dataclass(frozen=True)
class TrainerSpec:
  total_steps: int
  eval_every: int
  save_every: int
  keep_checkpoints: int
  sample_trajectories: int
  pad_multiple: int


@dataclasses.dataclass(frozen=True)
class SeedSpec:
  train: int
  val: int
  init: int


@dataclasses.dataclass(frozen=True)
class Experiment:
  envs: Tuple[EnvSpec, ...]
  model: ModelSpec
  rollout: RolloutSpec
  ppo: algos.PPOConfig
  sft: SFTConfig
  trainer: TrainerSpec
  seed: SeedSpec
  diagnostics: CollapseConfig = CollapseConfig()
  early_stop: EarlyStopConfig = EarlyStopConfig()
  mesh: MeshSpec = MeshSpec()

  @property
  def train_episodes(self) -> int:
    return sum(e.train_groups for e in self.envs) * self.rollout.group_size


def _fields(cls, section, name, exclude=()):
  """The section's values for `cls`'s fields; a missing or extra key is an error."""
  values = dict(section.items()) if hasattr(section, "items") else {}
  expected = {f.name for f in dataclasses.fields(cls)} - set(exclude)
  missing, extra = expected - set(values), set(values) - expected
  if missing:
    _fail(f"section {name!r} lacks {sorted(missing)}")
  if extra:
    _fail(f"section {name!r} has unknown keys {sorted(extra)}; valid: {sorted(expected)}")
  return values


def _env_spec(tag: str, section) -> EnvSpec:
  where = f"envs.{tag}"
  if section.name not in envs.REGISTRY:
    _fail(f"{where}.name {section.name!r} is not an environment; valid: {sorted(envs.REGISTRY)}")
  if section.render_format not in env_base.RENDER_FORMATS:
    _fail(f"{where}.render_format {section.render_format!r} not in {env_base.RENDER_FORMATS}")
  # Lists (e.g. a config read back from checkpoint JSON) become tuples: envs are hashable.
  hashable = lambda d: tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                    for k, v in d.to_dict().items()))
  options, val_options = hashable(section.options), hashable(section.val_options)
  spec = EnvSpec(tag, section.name, options, val_options, section.render_format,
                 section.max_actions_per_traj, section.max_tokens_hint, section.train_groups,
                 section.val_groups, section.get("sft_batches", 1))  # absent in older runs' configs
  _positive(where, spec, ("max_actions_per_traj", "max_tokens_hint", "train_groups",
                          "val_groups", "sft_batches"))
  try:
    spec.make()
    spec.make(validation=True)
  except (TypeError, ValueError) as e:
    _fail(f"{where}: {e}")
  return spec


def from_config(config) -> Experiment:
  """Validates an experiment ConfigDict (see module doc); raises ValueError naming the key."""
  for name in ("envs", "model", "rollout", "ppo", "sft", "trainer", "seed"):
    if name not in config:
      _fail(f"missing section {name!r}")
  if not config.envs.keys():
    _fail("envs must name at least one environment")
  env_specs = tuple(_env_spec(tag, config.envs[tag]) for tag in config.envs.keys())

  model = ModelSpec(**_fields(ModelSpec, config.model, "model"))
  if model.checkpoint is None and model.preset.lower() not in models.PRESETS:
    _fail(f"model.preset {model.preset!r} is unknown; valid: {sorted(models.PRESETS)}")
  if model.checkpoint is None and model.preset.lower().startswith("qwen"):
    _fail(f"model.preset {model.preset!r} needs real weights: pass "
          "--config.model.checkpoint=DIR (a local Hugging Face directory)")
  if model.checkpoint is not None and not os.path.isfile(
      os.path.join(model.checkpoint, "config.json")):
    _fail(f"model.checkpoint {model.checkpoint!r} is not a Hugging Face directory "
          "(no config.json)")
  if model.warm_start and model.checkpoint is None and model.preset.lower() != "tiny":
    _fail(f"model.warm_start exists for the tiny preset only (got {model.preset!r}); set "
          "--config.model.warm_start=False")
  if model.dtype not in _DTYPES:
    _fail(f"model.dtype {model.dtype!r} not in {_DTYPES}")

  rollout = RolloutSpec(**_fields(RolloutSpec, config.rollout, "rollout"))
  _positive("rollout", rollout, ("group_size", "max_turns", "max_actions_per_turn",
                                 "max_new_tokens", "max_turn_tokens", "val_group_size",
                                 "val_batch_groups"))
  if rollout.max_context <= rollout.max_new_tokens:
    _fail("rollout.max_context must exceed rollout.max_new_tokens")
  if rollout.temperature <= 0 or rollout.val_temperature < 0:
    _fail("rollout.temperature must be > 0 and rollout.val_temperature >= 0")

  # The update's temperature is the rollout's (log-probs of the sampling distribution).
  ppo_values = _fields(algos.PPOConfig, config.ppo, "ppo", exclude=("temperature",))
  sft_values = _fields(SFTConfig, config.sft, "sft")
  trainer = TrainerSpec(**_fields(TrainerSpec, config.trainer, "trainer"))
  _positive("trainer", trainer, ("eval_every", "save_every", "keep_checkpoints",
                                 "pad_multiple"))
  _positive("trainer", trainer, ("total_steps", "sample_trajectories"), minimum=0)
  # Optional sections (runs saved before they existed): absent means the defaults.
  diag_values = (_fields(CollapseConfig, config.diagnostics, "diagnostics")
                 if "diagnostics" in config else {})
  stop_values = (_fields(EarlyStopConfig, config.early_stop, "early_stop")
                 if "early_stop" in config else {})
  mesh_values = (_fields(MeshSpec, config.mesh, "mesh") if "mesh" in config else {})
  if "rules" in mesh_values and hasattr(mesh_values["rules"], "to_dict"):
    mesh_values["rules"] = mesh_values["rules"].to_dict()
  try:
    ppo = algos.PPOConfig(**ppo_values, temperature=rollout.temperature)
    sft = SFTConfig(**sft_values)
    diag = CollapseConfig(**diag_values)
    early_stop = EarlyStopConfig(**stop_values)
    mesh = MeshSpec(**mesh_values)
  except (TypeError, ValueError) as e:
    _fail(str(e))
  exp = Experiment(env_specs, model, rollout, ppo, sft, trainer,
                   SeedSpec(**_fields(SeedSpec, config.seed, "seed")), diag, early_stop, mesh)
  try:
    ppo.check_batch(exp.train_episodes)
  except ValueError as e:
    _fail(f"{e} (training episodes per step = sum of envs.*.train_groups x rollout.group_size)")
  if sft.steps and model.checkpoint is not None:
    _fail("sft.steps > 0 fine-tunes the tiny from-scratch model; with model.checkpoint set "
          "use sft.steps=0")
  return exp


def describe(exp: Experiment) -> Dict[str, Any]:
  """A JSON-serialisable view (logged at start and stored with checkpoints)."""
  return dataclasses.asdict(exp)
