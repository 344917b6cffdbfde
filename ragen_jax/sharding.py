"""The device mesh and named shardings: one rules table maps logical axis names to mesh axes.

    spec = sharding.MeshSpec(data=2, fsdp=2, tensor=2)         # config.mesh; -1 fills the rest
    sharder = sharding.Sharder(spec)                          # a Mesh over jax.devices()
    sharder.check_model(model_config); sharder.check_batch("rollout of sokoban", 32)
    model = models.create("tiny", key, sharding=sharder.named)  # parameters born sharded
    state = jax.device_put(state, sharder.tree(state))         # optimizer states follow params

Mesh axes: `data` (pure data parallelism), `fsdp` (data parallelism whose devices also split the
parameters and optimizer states), `tensor` (heads, MLP and vocabulary split within a layer).
Logical axes are the names the model's parameters carry (`layers embed heads kv_heads head_dim mlp
vocab`) plus `batch` and `length` for batches and the KV cache; a Qwen2.5-VL's vision tower
carries the same names (`vision_config.vision_table`: its width is `embed`, its heads `heads`,
its SwiGLU and the merger's hidden layer `mlp`), so fsdp and tensor split it as they split the
decoder. The default rules put `batch`
on data x fsdp, `embed` on fsdp, and heads, kv_heads, mlp and vocab on tensor; XLA's sharding
propagation (GSPMD) partitions everything in between and inserts the collectives. The same
code therefore runs on 1 CPU (a 1x1x1 mesh), 8 simulated devices, one GPU, or many hosts.

Sizes that do not divide raise a ValueError naming both numbers before anything compiles.
"""

import dataclasses
import functools
import math
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple

import jax
from jax.sharding import AxisType
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np

from ragen_jax import config_checks
from ragen_jax.config_checks import NonNegativeInt

MESH_AXES = ("data", "fsdp", "tensor")
LOGICAL_AXES = (
    "batch",
    "length",
    "layers",
    "embed",
    "heads",
    "kv_heads",
    "head_dim",
    "mlp",
    "vocab",
)
# Logical axis -> mesh axes. Parameters, optimizer states, the KV cache and batches carry these
# names; the config's `mesh.rules` writes each as "a,b" ("" = replicated).
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),  # episodes of a batch
    ("length", ()),  # sequence / cache positions
    ("layers", ()),  # the stacked-layer axis
    ("embed", ("fsdp",)),  # hidden size (FSDP splits parameters on it)
    ("heads", ("tensor",)),  # query heads
    ("kv_heads", ("tensor",)),  # key/value heads (and the KV cache)
    ("head_dim", ()),
    ("mlp", ("tensor",)),  # MLP hidden size
    ("vocab", ("tensor",)),
)  # vocabulary rows of embedding and head
# What each logical axis of the model is, for error messages.
_MEANING = {
    "embed": "hidden size",
    "heads": "query heads",
    "kv_heads": "key/value heads",
    "head_dim": "head size",
    "mlp": "MLP size",
    "vocab": "vocabulary rows",
    "layers": "layers",
}


def parse_rules(rules: Any) -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
  """Rules from a mapping {logical: "data,fsdp" | ("data", "fsdp") | "" | None}, validated."""
  items = dict(rules.items() if hasattr(rules, "items") else rules)
  out = []
  for name in LOGICAL_AXES:
    if name not in items:
      raise ValueError(f"mesh.rules lacks logical axis {name!r}; valid axes: {LOGICAL_AXES}")
    value = items.pop(name)
    if value is None or isinstance(value, str):
      axes = tuple(a.strip() for a in (value or "").split(",") if a.strip())
    else:
      axes = tuple(value)
    bad = [a for a in axes if a not in MESH_AXES]
    if bad or len(set(axes)) != len(axes):
      raise ValueError(f"mesh.rules.{name} = {value!r}: use distinct mesh axes from {MESH_AXES}")
    out.append((name, axes))
  if items:
    raise ValueError(
        f"mesh.rules has unknown logical axes {sorted(items)}; valid: " f"{LOGICAL_AXES}"
    )
  return tuple(out)


@dataclasses.dataclass(frozen=True)
class MeshSpec:
  """Mesh shape (data, fsdp, tensor; one of them may be -1: all remaining devices) and rules."""

  data: int = -1  # pure data parallelism (-1: every device fsdp x tensor leave)
  fsdp: int = 1  # data parallelism that also splits parameters and optimizer states
  tensor: int = 1  # query/key-value heads, MLP and vocabulary split
  rules: Tuple[Tuple[str, Tuple[str, ...]], ...] = dataclasses.field(
      default=DEFAULT_RULES,
      metadata={"section": lambda rules: {name: ",".join(axes) for name, axes in rules}},
  )  # the config's form of the table
  # trainer.async_rollout: the first N devices play rollouts (data x tensor, the training
  # mesh's tensor size), the rest train on the data x fsdp x tensor mesh above; 0 = none
  rollout_devices: int = 0

  def __post_init__(self):
    config_checks.check_value("mesh.rollout_devices", self.rollout_devices, NonNegativeInt)
    sizes = (self.data, self.fsdp, self.tensor)
    if any(not isinstance(s, int) or (s < 1 and s != -1) for s in sizes):
      raise ValueError(
          f"mesh sizes must be positive integers or -1, got data={self.data}, "
          f"fsdp={self.fsdp}, tensor={self.tensor}"
      )
    if sizes.count(-1) > 1:
      raise ValueError("at most one of mesh.data, mesh.fsdp, mesh.tensor may be -1")
    object.__setattr__(self, "rules", parse_rules(self.rules))

  def shape(self, num_devices: int) -> Tuple[int, int, int]:
    """(data, fsdp, tensor) for `num_devices`, -1 resolved; the product must match."""
    sizes = [self.data, self.fsdp, self.tensor]
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
      if num_devices % known:
        raise ValueError(
            f"mesh: {num_devices} devices do not divide by the fixed axes "
            f"(product {known}) to fill the -1 axis"
        )
      sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
      raise ValueError(
          f"mesh data x fsdp x tensor = {' x '.join(map(str, sizes))} = "
          f"{math.prod(sizes)} devices, but {num_devices} are available"
      )
    return tuple(sizes)

  def rollout_spec(self) -> "MeshSpec":
    """The rollout devices' mesh: episodes over data, the training mesh's tensor split."""
    return dataclasses.replace(self, data=-1, fsdp=1, rollout_devices=0)


def split_devices(
    spec: MeshSpec, devices: Sequence[jax.Device]
) -> Tuple[Sequence[jax.Device], Sequence[jax.Device]]:
  """(rollout devices, training devices): the first `spec.rollout_devices`, and the rest; a
  ValueError naming mesh.rollout_devices when either side would be empty."""
  n = spec.rollout_devices
  if n < 1:
    raise ValueError(f"mesh.rollout_devices = {n}: the rollout needs at least one device")
  if n >= len(devices):
    raise ValueError(
        f"mesh.rollout_devices = {n} leaves none of the {len(devices)} devices to train on; "
        f"give the rollout at most {len(devices) - 1}"
    )
  return devices[:n], devices[n:]


class Sharder:
  """A Mesh plus the rules table; turns logical axis names into NamedShardings.

  `Sharder(spec, num_devices=n)` builds no Mesh: only the checks work, for any device count.
  """

  def __init__(
      self,
      spec: MeshSpec,
      devices: Optional[Sequence[jax.Device]] = None,
      *,
      num_devices: Optional[int] = None,
  ):
    self.spec = spec
    self.rules: Dict[str, Tuple[str, ...]] = dict(spec.rules)
    if num_devices is not None and devices is None:
      self.shape = dict(zip(MESH_AXES, spec.shape(num_devices)))
      self.mesh = None
      return
    devices = list(jax.devices() if devices is None else devices)
    shape = spec.shape(len(devices))
    self.shape = dict(zip(MESH_AXES, shape))
    self.mesh = Mesh(
        np.asarray(devices).reshape(shape), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES)
    )

  def __repr__(self) -> str:
    return f"Sharder(mesh={self.shape})"

  def size(self, logical: Optional[str]) -> int:
    """Devices an axis of this logical name is split over (1: replicated)."""
    return math.prod(self.shape[a] for a in self.rules.get(logical, ())) if logical else 1

  def pspec(self, axes: Iterable[Optional[str]]) -> PartitionSpec:
    parts, used = [], set()
    for name in axes:
      mesh_axes = tuple(a for a in self.rules.get(name, ()) if a not in used) if name else ()
      used.update(mesh_axes)  # a mesh axis can split only one dimension of an array
      parts.append(mesh_axes if len(mesh_axes) > 1 else (mesh_axes[0] if mesh_axes else None))
    return PartitionSpec(*parts)

  def named(self, axes: Iterable[Optional[str]] = ()) -> NamedSharding:
    """The NamedSharding of an array whose dimensions have these logical names."""
    return NamedSharding(self.mesh, self.pspec(tuple(axes)))

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec())

  # ------------------------------------------------------------------ checks

  def _check(self, what: str, logical: str, size: int, hint: str = "") -> None:
    n = self.size(logical)
    if size % n:
      axes = " x ".join(f"{a} = {self.shape[a]}" for a in self.rules[logical])
      raise ValueError(
          f"mesh: {what} = {size} cannot be split over {axes} ({n} devices; "
          f"logical axis {logical!r}){hint}"
      )

  def check_model(self, config) -> None:
    """Every model dimension, the vision tower's included, divides the mesh axes its logical
    axis maps to."""
    sizes = [
        ("the model's", "embed", config.hidden_size),
        ("the model's", "heads", config.num_heads),
        ("the model's", "kv_heads", config.num_kv_heads),
        ("the model's", "head_dim", config.head_dim),
        ("the model's", "mlp", config.intermediate_size),
        ("the model's", "vocab", config.vocab_size),
        ("the model's", "layers", config.num_layers),
    ]
    v = config.vision
    if v is not None:  # `vision_config.vision_table`'s names; the merger's hidden width is "mlp"
      sizes += [
          ("the vision tower's", "embed", v.hidden_size),
          ("the vision tower's", "heads", v.num_heads),
          ("the vision tower's", "head_dim", v.head_dim),
          ("the vision tower's", "mlp", v.intermediate_size),
          ("the vision merger's", "mlp", v.hidden_size * v.merge_unit),
          ("the vision tower's", "layers", v.depth),
      ]
    for whose, logical, size in sizes:
      self._check(
          f"{whose} {_MEANING[logical]}",
          logical,
          size,
          f"; choose mesh sizes that divide {size}, or map {logical} to fewer mesh "
          f"axes with --config.mesh.rules.{logical}=...",
      )

  def check_batch(self, what: str, size: int) -> None:
    self._check(what, "batch", size, "; make it a multiple of mesh.data x mesh.fsdp")

  # ------------------------------------------------------------------ trees

  def tree(self, tree: Any, axes_by_path: Dict[Tuple[str, ...], Tuple] | None = None) -> Any:
    """Shardings for a tree of arrays (a TrainState, optimizer states, parameter dicts).

    A leaf whose dict-key path ends with a parameter path from `axes_by_path` (default: the
    Qwen2 / Qwen2Critic parameter table) and has the same rank gets that parameter's logical
    axes: so Adam's moments follow their parameters. Everything else is replicated.
    """
    table = param_axes() if axes_by_path is None else axes_by_path
    longest = max(map(len, table), default=0)

    def one(path, leaf):
      keys = tuple(getattr(k, "key", None) for k in path)
      for n in range(min(longest, len(keys)), 0, -1):
        axes = table.get(keys[-n:])
        if axes is not None and len(axes) == np.ndim(leaf):
          return self.named(axes)
      return self.replicated

    return jax.tree_util.tree_map_with_path(one, tree)

  def batch_tree(self, tree: Any) -> Any:
    """Shardings for per-episode arrays ([B, ...]: batch on data x fsdp)."""
    return jax.tree.map(lambda x: self.named(("batch",) + (None,) * (np.ndim(x) - 1)), tree)

  def cache(self, cache) -> Any:
    """Shardings of a models.KVCache: episodes over batch, key/value heads over tensor."""
    kv = self.named((None, "batch", "kv_heads", "length", "head_dim"))
    return type(cache)(
        k_LxBxKxSxDh=kv,
        v_LxBxKxSxDh=kv,
        mask_BxS=self.named(("batch", "length")),
        end_index=self.replicated,
        rope_delta_B=None if cache.rope_delta_B is None else self.named(("batch",)),
    )


@functools.lru_cache(maxsize=1)
def param_axes() -> Dict[Tuple[str, ...], Tuple]:
  """{parameter path: logical axes} of the policy and critic of every family (from their
  metadata): Qwen2's q/k/v biases, Qwen3's q/k norms, LoRA adapters and Qwen2.5-VL's vision
  tower included."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from ragen_jax import models  # pylint: disable=g-import-not-at-top

  table = {}
  tiny = models.get_config("tiny").replace(  # with lm_head and adapters on every kernel
      tie_word_embeddings=False, lora=models.LoraConfig(rank=2)
  )
  text = (tiny, tiny.replace(model_type="qwen3"))
  modules = [(cls, c) for c in text for cls in (models.Qwen2, models.Qwen2Critic)]
  # Qwen2.5-VL's vision tower (`visual`, the policy's alone): the decoder's logical names.
  modules.append((models.Qwen2_5_VL, models.get_config("tiny-vl")))
  for cls, config in modules:
    abstract = nnx.eval_shape(lambda cls=cls, config=config: cls(config, rngs=nnx.Rngs(0)))
    for path, var in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):
      table[tuple(path)] = tuple(var.get_metadata().get("out_sharding") or ())
  return table
