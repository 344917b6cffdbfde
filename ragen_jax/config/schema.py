"""The experiment: one typed dataclass per config section, validated once with clear errors.

    exp = schema.from_config(config)       # config: the ml_collections.ConfigDict of configs/*.py
    exp.envs[0].make()                     # the environment of the first tag
    exp.envs[0].rollout_config(exp.rollout, validation=False)

Every knob is declared once, as a field of the dataclass in `SECTIONS` that uses it (default and
one-line comment there); `ragen_jax.config.sections` derives the ConfigDict sections of
`configs/*.py` from these fields, and `from_config` is construction (`Cls(**section)`, each
class checking its own values in `__post_init__`) plus the checks that span sections: model
preset or checkpoint directory, that every environment builds with its options, and that the
training batch splits into minibatches and micro-batches. Every numeric knob, an environment's
options included, declares its range in its annotation (`ragen_jax.config_checks`), so a NaN, an
infinity or a value out of range fails here with its key named. What depends on the devices
present (the mesh's shape, sizes that must divide it) is checked by `sharding.Sharder` when the
run starts, still before anything compiles.
"""

import dataclasses
import os
import urllib.parse
from typing import Annotated, Any, Dict, Tuple

from ragen_jax import algos
from ragen_jax import envs
from ragen_jax import models
from ragen_jax import rollout as rollout_lib
from ragen_jax.config_checks import check_arguments, check_fields, NonNegativeInt, OneOf
from ragen_jax.config_checks import NonNegativeFloat, PositiveFloat, PositiveInt, UnitFloat
from ragen_jax.diagnostics import CollapseConfig
from ragen_jax.envs.device import base as env_base
from ragen_jax.sharding import MeshSpec
from ragen_jax.diagnostics.early_stop import EarlyStopConfig
from ragen_jax.warm_start.sft import SFTConfig

_DTYPES = ("float32", "bfloat16", "float16")
PARAM_DTYPES = ("float32", "bfloat16")


def _fail(msg):
  raise ValueError(f"config: {msg}")


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """One environment tag (RAGEN's custom_envs entry plus its es_manager group counts).

  Its section also holds `rollout.RolloutConfig.PER_TAG` (render format, action budget, the
  prompt's length hint), declared there.
  """

  name: str  # ragen_jax.envs registry name
  entry: str = ""  # "package.module:Name" or the http:// URL of a served text environment;
  # replaces `name` (no registration needed)
  options: Tuple[Tuple[str, Any], ...] = ()  # keyword arguments of the environment
  val_options: Tuple[Tuple[str, Any], ...] = ()  # overrides of `options` for validation
  train_groups: PositiveInt = 8  # env groups of this tag per training step
  val_groups: PositiveInt = 64  # validation groups (group g plays the level of seed.val + g)
  sft_batches: PositiveInt = 1  # demonstration batches of this tag per round of the SFT mix
  pool: str = "thread"  # text environments: step in threads, or "process" (CPU-bound ones)
  workers: NonNegativeInt = 0  # processes of the "process" pool (0: one per CPU core)
  step_timeout_s: PositiveFloat = 60.0  # a text environment's reset or turn taking longer fails
  max_env_errors: UnitFloat = 0.25  # stop the run when a larger share of a rollout's episodes
  # end in an environment fault (env_error), before training on them
  per_tag: Tuple[Tuple[str, Any], ...] = ()  # RolloutConfig.PER_TAG values of this tag
  tag: str = ""  # the section's name in config.envs (set by from_config)

  def __post_init__(self):
    check_fields(self, f"envs.{self.tag or self.label}")

  def make(self, validation: bool = False):
    """The environment: a pure-JAX `envs.Env`, or an `envs.HostEnv` for a text environment."""
    options = dict(self.options)
    if validation:
      options.update(self.val_options)
    return envs.make(
        self.name,
        entry=self.entry,
        pool=self.pool,
        workers=self.workers or None,
        step_timeout_s=self.step_timeout_s,
        **options,
    )

  @property
  def label(self) -> str:
    return self.entry or self.name

  def rollout_config(
      self, rollout: rollout_lib.RolloutConfig, validation: bool
  ) -> rollout_lib.RolloutConfig:
    """The run's rollout knobs with this tag's group count and per-tag values."""
    base = rollout.for_validation() if validation else rollout
    groups = min(self.val_groups, rollout.val_batch_groups) if validation else self.train_groups
    return dataclasses.replace(base, env_groups=groups, **dict(self.per_tag))


@dataclasses.dataclass(frozen=True)
class LoraSpec:
  """LoRA on the policy (ragen_jax/models/lora.py): `model.lora.rank` > 0 trains only low-rank
  adapters of `targets`, scaled by alpha / rank, on frozen base weights (RAGEN: rank 64,
  alpha 64, all linear layers); the KL reference is then the base itself (no copy)."""

  rank: NonNegativeInt = 0  # adapter rank; 0 trains every weight (no adapters)
  alpha: PositiveFloat = 64.0  # the adapters' output is scaled by alpha / rank
  targets: Tuple[str, ...] = models.config.LORA_TARGETS  # of q, k, v, o, gate, up, down
  dropout: NonNegativeFloat = 0.0  # adapter dropout: not implemented, must be 0

  def __post_init__(self):
    check_fields(self, "model.lora")
    object.__setattr__(self, "targets", tuple(self.targets))
    try:
      self.config()
      if self.dropout:
        raise ValueError(f"dropout is not implemented; it must be 0, got {self.dropout!r}")
    except ValueError as e:
      raise ValueError(f"model.lora: {e}") from e

  def config(self) -> models.LoraConfig | None:
    """The model's LoraConfig, None for rank 0."""
    if not self.rank:
      return None
    return models.LoraConfig(self.rank, self.alpha, self.targets, self.dropout)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """Which policy a run starts from."""

  preset: str = "tiny"  # ragen_jax.models.PRESETS name (used without checkpoint)
  checkpoint: str | None = None  # local Hugging Face directory or GGUF file; replaces the preset
  warm_start: bool = True  # tiny preset: start from the shipped fine-tuned weights
  # (ragen_jax/assets/tiny_warm_start, configs/warm_start_sft.py)
  tokenizer: str = "sentencepiece"  # without a checkpoint (or one lacking tokenizer.json)
  dtype: str = "float32"  # activation / compute dtype
  param_dtype: str = "float32"  # storage of the actor's, critic's and reference's weights
  # ("float32" | "bfloat16"); updates are computed in float32 (algos/optim.py: what is lost)
  remat: bool = False  # recompute each layer in the backward pass (memory)
  # Self-attention kernel: auto | xla | cudnn | splash (ragen_jax/models/attention.py); auto is
  # cuDNN's fused kernel on an NVIDIA GPU in bf16, splash on a TPU, XLA otherwise.
  attention: Annotated[str, OneOf(models.attention.IMPLEMENTATIONS)] = "auto"
  # Queries per block of the XLA kernel (models.ModelConfig.attention_block): smaller blocks
  # compute less of the masked half of the scores, one block the length of the rows compiles
  # fastest (the :smoke variant's).
  attention_block: PositiveInt = models.attention.QUERY_BLOCK
  lora: LoraSpec = dataclasses.field(  # low-rank adapters (LoraSpec); rank 0: none
      default_factory=LoraSpec, metadata={"section": dataclasses.asdict}
  )

  def __post_init__(self):
    if isinstance(self.lora, dict):
      object.__setattr__(self, "lora", LoraSpec(**self.lora))
    check_fields(self, "model")


@dataclasses.dataclass(frozen=True)
class TrainerSpec:
  """The run's schedule."""

  total_steps: NonNegativeInt = 200  # training steps (RAGEN total_training_steps)
  eval_every: PositiveInt = 10  # validation every N steps, and at step 0 (RAGEN test_freq)
  save_every: PositiveInt = 10  # checkpoint every N steps (and at the end)
  keep_checkpoints: PositiveInt = 3  # newest checkpoints kept
  sample_trajectories: NonNegativeInt = 3  # validation trajectories logged as text each time
  pad_multiple: PositiveInt = 128  # training sequences padded to a multiple of this, so the
  # train step compiles once per length bucket
  # Rollouts one step ahead on their own devices (mesh.rollout_devices; train/pipeline.py): the
  # rollout of step s+1 plays while step s trains, with weights at most max_staleness steps old
  async_rollout: bool = False
  max_staleness: NonNegativeInt = 1  # 0: each rollout waits for the newest weights (synchronous)

  def __post_init__(self):
    check_fields(self, "trainer")


@dataclasses.dataclass(frozen=True)
class SeedSpec:
  """Seeds; every random choice of a run derives from these (ragen_jax.keys)."""

  train: NonNegativeInt = 10000  # first training level seed (advances by groups per step)
  val: NonNegativeInt = 123  # first validation level seed
  init: NonNegativeInt = 0  # model init, sampling and shuffling keys

  def __post_init__(self):
    check_fields(self, "seed")


# Characters a W&B project name cannot hold (the name is also the MLflow experiment's).
_PROJECT_FORBIDDEN = "/\\#?%:"


@dataclasses.dataclass(frozen=True)
class LoggingSpec:
  """Where the run's scalars go besides its TensorBoard events, which are always written to the
  workdir (ragen_jax/trackers: Weights & Biases, MLflow). Only process 0 logs."""

  project: str = "ragen_jax"  # the W&B project and the MLflow experiment
  run_name: str | None = None  # the run's name in both; None: the workdir's directory name
  # Weights & Biases (`pip install wandb`); WANDB_MODE=offline keeps the run in local files that
  # `wandb sync` uploads later. The key comes from `wandb login` or WANDB_API_KEY, never a config.
  wandb: bool = False
  # MLflow tracking URI (`pip install mlflow-skinny`): a file store `file:///abs/path`, or a
  # server `http(s)://host:port`; None: no MLflow
  mlflow_uri: str | None = None

  def __post_init__(self):
    name = self.project
    if not name or len(name) > 128 or any(c in _PROJECT_FORBIDDEN for c in name):
      raise ValueError(
          f"logging.project must be 1 to 128 characters without any of {_PROJECT_FORBIDDEN!r} "
          f"(a W&B project name), got {name!r}"
      )
    if self.run_name is not None and not self.run_name.strip():
      raise ValueError(f"logging.run_name must be None or a name, got {self.run_name!r}")
    uri = self.mlflow_uri
    if uri is not None and (not uri or uri != uri.strip()):
      raise ValueError(f"logging.mlflow_uri must be None or a tracking URI, got {uri!r}")
    parsed = urllib.parse.urlparse(uri or "")
    if parsed.username or parsed.password:  # the config is stored with the run and logged
      raise ValueError(
          "logging.mlflow_uri must hold no user or password; set MLFLOW_TRACKING_USERNAME and "
          "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) in the environment instead"
      )
    if parsed.scheme == "file" and (
        parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/")
    ):
      raise ValueError(
          f"logging.mlflow_uri: a file store is file:///absolute/path, got {uri!r} (a relative "
          "path works without the scheme)"
      )


# Section name -> (dataclass, fields that are not config keys). The rollout's per-tag fields
# live in each env section.
SECTIONS = {
    "model": (ModelSpec, ()),
    "rollout": (
        rollout_lib.RolloutConfig,
        ("env_groups", "instruction") + rollout_lib.RolloutConfig.PER_TAG,
    ),
    "ppo": (algos.PPOConfig, ()),
    "sft": (SFTConfig, ()),
    "trainer": (TrainerSpec, ()),
    "diagnostics": (CollapseConfig, ()),
    "early_stop": (EarlyStopConfig, ()),
    "mesh": (MeshSpec, ()),
    "seed": (SeedSpec, ()),
    "api": (rollout_lib.api_policy.ApiConfig, ()),
    "logging": (LoggingSpec, ()),
}
ENV_KEYS = tuple(f.name for f in dataclasses.fields(EnvSpec) if f.name not in ("per_tag", "tag"))


@dataclasses.dataclass(frozen=True)
class Experiment:
  envs: Tuple[EnvSpec, ...]
  model: ModelSpec
  rollout: rollout_lib.RolloutConfig
  ppo: algos.PPOConfig
  sft: SFTConfig
  trainer: TrainerSpec
  diagnostics: CollapseConfig
  early_stop: EarlyStopConfig
  mesh: MeshSpec
  seed: SeedSpec
  api: rollout_lib.api_policy.ApiConfig  # an endpoint that answers instead (evaluate only)
  logging: LoggingSpec  # experiment trackers besides TensorBoard

  @property
  def train_episodes(self) -> int:
    return sum(e.train_groups for e in self.envs) * self.rollout.group_size


def _values(section, name: str, keys) -> Dict[str, Any]:
  """The section's values for `keys`; a missing or extra key is an error."""
  values = dict(section.items()) if hasattr(section, "items") else {}
  missing, extra = set(keys) - set(values), set(values) - set(keys)
  if missing:
    _fail(f"section {name!r} lacks {sorted(missing)}")
  if extra:
    _fail(f"section {name!r} has unknown keys {sorted(extra)}; valid: {sorted(keys)}")
  return values


def section_keys(cls, exclude=()) -> Tuple[str, ...]:
  return tuple(f.name for f in dataclasses.fields(cls) if f.init and f.name not in exclude)


def _hashable(d) -> Tuple[Tuple[str, Any], ...]:
  # Lists (e.g. a config read back from JSON) become tuples: environments are hashable.
  d = d.to_dict() if hasattr(d, "to_dict") else dict(d)
  return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in d.items()))


def _env_spec(tag: str, section) -> EnvSpec:
  where = f"envs.{tag}"
  values = _values(section, where, ENV_KEYS + rollout_lib.RolloutConfig.PER_TAG)
  if values["render_format"] not in env_base.RENDER_FORMATS:
    _fail(f"{where}.render_format {values['render_format']!r} not in " f"{env_base.RENDER_FORMATS}")
  per_tag = tuple((k, values.pop(k)) for k in rollout_lib.RolloutConfig.PER_TAG)
  try:
    spec = EnvSpec(
        **{
            **values,
            "options": _hashable(values["options"]),
            "val_options": _hashable(values["val_options"]),
        },
        per_tag=per_tag,
        tag=tag,
    )
    # The ranges the environment declares for its options, checked here under their config
    # keys (a text environment is only built when a rollout starts).
    factory = envs.registry.resolve(spec.name, spec.entry)
    for key in ("options", "val_options"):
      check_arguments(factory, dict(getattr(spec, key)), f"{where}.{key}")
    env_base.check_render_format(spec.make(), dict(per_tag)["render_format"])
    spec.make(validation=True)
  except (TypeError, ValueError) as e:
    message = str(e)  # a message naming its key already needs no prefix
    _fail(message if message.startswith(f"{where}.") else f"{where}: {message}")
  return spec


def _check_model(model: ModelSpec) -> None:
  if model.checkpoint is None and model.preset.lower() not in models.PRESETS:
    _fail(f"model.preset {model.preset!r} is unknown; valid: {sorted(models.PRESETS)}")
  if model.checkpoint is None and model.preset.lower().startswith("qwen"):
    _fail(
        f"model.preset {model.preset!r} needs real weights: pass "
        "--config.model.checkpoint=DIR (a local Hugging Face directory)"
    )
  if model.checkpoint is not None:
    _check_checkpoint(model.checkpoint)
  if model.warm_start and model.checkpoint is None and model.preset.lower() != "tiny":
    _fail(
        f"model.warm_start exists for the tiny preset only (got {model.preset!r}); set "
        "--config.model.warm_start=False"
    )
  if model.dtype not in _DTYPES:
    _fail(f"model.dtype {model.dtype!r} not in {_DTYPES}")
  if model.param_dtype not in PARAM_DTYPES:
    _fail(f"model.param_dtype {model.param_dtype!r} not in {PARAM_DTYPES}")


def _check_checkpoint(path: str) -> None:
  """A Hugging Face directory or a GGUF file; a fetchable model not yet fetched says how."""
  if models.gguf_checkpoint.is_gguf(path):
    if not os.path.isfile(path):
      hint = models.fetch.hint(path)
      _fail(f"model.checkpoint {path!r}: no such GGUF file{'; ' + hint if hint else ''}")
  elif not os.path.isfile(os.path.join(path, "config.json")):
    _fail(
        f"model.checkpoint {path!r} is neither a Hugging Face directory (no config.json) nor a "
        "GGUF file"
    )


def _check_async(exp: Experiment) -> None:
  """What asynchronous rollouts need from the other sections (the devices: at start)."""
  n, on = exp.mesh.rollout_devices, exp.trainer.async_rollout
  if n and not on:
    _fail(f"mesh.rollout_devices = {n} needs trainer.async_rollout=True (or set it to 0)")
  if on and not n:
    _fail("trainer.async_rollout=True needs mesh.rollout_devices >= 1 (the rollout's devices)")
  if on and not exp.ppo.recompute_old_logprobs:
    _fail(
        "trainer.async_rollout=True needs ppo.recompute_old_logprobs=True: the PPO ratio is taken "
        "against the trained policy at the step's start, and the sampler's (stale) log-probs "
        "are the behaviour policy of ppo.rollout_correction"
    )


def from_config(config) -> Experiment:
  """Validates an experiment ConfigDict (see module doc); raises ValueError naming the key."""
  for name in ("envs", *SECTIONS):
    if name not in config:
      _fail(f"missing section {name!r}")
  if not config.envs.keys():
    _fail("envs must name at least one environment")
  env_specs = tuple(_env_spec(tag, config.envs[tag]) for tag in config.envs.keys())
  built = {}
  for name, (cls, exclude) in SECTIONS.items():
    values = _values(config[name], name, section_keys(cls, exclude))
    values = {k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in values.items()}
    try:
      built[name] = cls(**values)
    except (TypeError, ValueError) as e:
      _fail(str(e))
  exp = Experiment(envs=env_specs, **built)
  for spec in exp.envs:  # the per-tag rollout values, checked by RolloutConfig itself
    try:
      spec.rollout_config(exp.rollout, validation=False)
    except ValueError as e:
      _fail(f"envs.{spec.tag}: {e}")
  _check_model(exp.model)
  _check_async(exp)
  try:
    exp.ppo.check_batch(exp.train_episodes)
  except ValueError as e:
    _fail(f"{e} (training episodes per step = sum of envs.*.train_groups x rollout.group_size)")
  no_expert = [e.tag for e in exp.envs if not rollout_lib.env_batch.has_expert(e.make())]
  if exp.sft.steps and no_expert:
    _fail(
        f"sft.steps > 0 plays scripted experts, and envs {no_expert} have none "
        "(a text environment demonstrates when its class defines expert()); use sft.steps=0"
    )
  return exp


def check_images(exp: Experiment, model: models.ModelConfig) -> None:
  """A vision-language model (Qwen2.5-VL: `model.vision`) plays environments drawn as images
  (`image_shape`) only, and each of those needs one; raises ValueError naming the tags. The model
  is the run's architecture (`train.policy.model_config`: a checkpoint's config.json decides)."""
  drawn = [e.tag for e in exp.envs if getattr(e.make(), "image_shape", None) is not None]
  text = [e.tag for e in exp.envs if e.tag not in drawn]
  name = exp.model.checkpoint or exp.model.preset
  if model.vision is not None and text:
    _fail(
        f"model {name!r} is a vision-language model (Qwen2.5-VL), which plays environments "
        f"drawn as images only, and envs {text} are text: use a visual environment "
        "(visual_sokoban, visual_frozenlake: configs/visual_*_ppo.py) or a text model"
    )
  if model.vision is None and drawn:
    _fail(
        f"envs {drawn} are drawn as images and need a vision-language model, and model "
        f"{name!r} (model_type {model.model_type!r}) takes none: use model.preset=tiny-vl, or "
        "a Qwen2.5-VL checkpoint (the :qwen2.5-vl-3b variant)"
    )


def describe(exp: Experiment) -> Dict[str, Any]:
  """A JSON-serialisable view (logged at start)."""
  return dataclasses.asdict(exp)
