"""RAGEN's two-armed bandit with named arms, as pure JAX functions.

Each episode draws one (low-risk, high-risk) name pair from the split and shows the two names
in random order; action i pulls the i-th arm as rendered. The low-risk arm pays
`lo_arm_score`; the high-risk arm pays `hi_arm_hiscore` with probability `hi_arm_hiscore_prob`,
else `hi_arm_loscore`. One step ends the episode; success means the high-risk arm was pulled.
"""

import dataclasses
import re
from typing import Annotated, List, Tuple

from flax import struct
import jax
import jax.numpy as jnp

from ragen_jax.config_checks import check_fields, FiniteFloat, OneOf, UnitFloat
from ragen_jax.envs.device import base

# RAGEN's arm-name pairs (low-risk name, high-risk name).
ARM_NAMES = {
    "train": (
        ("Teacher", "Trader"),
        ("Nurse", "StartupFounder"),
        ("Librarian", "Investor"),
        ("Accountant", "StockBroker"),
        ("Engineer", "RealEstateAgent"),
        ("Pharmacist", "Musician"),
        ("Clerk", "Freelancer"),
        ("Technician", "Youtuber"),
        ("Planner", "Artist"),
        ("Postman", "Pilot"),
        ("Banker", "VentureCapitalist"),
        ("Gardener", "Cryptominer"),
    ),
    "test": (
        ("Receptionist", "Explorer"),
        ("Archivist", "Filmmaker"),
        ("Bookkeeper", "Consultant"),
        ("SocialWorker", "Photographer"),
        ("Mechanic", "GameDesigner"),
        ("Secretary", "Entrepreneur"),
        ("Cashier", "DataScientist"),
        ("CivilServant", "StartupAccelerator"),
    ),
}

# RAGEN's prompt, including its trailing spaces.
PROMPT = (
    "You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to "
    "pull. \nGame Rules: \n1. There are 2 arms, named {a} and {b}\n2. Each arm has its own reward "
    "distribution, related to their names. \n3. Analyze the symbolic meaning of each arm's name "
    "to guess how their reward distribution might behave.\n4. Based on the symbolic meaning of "
    "their names, which arm do you think is more likely to give higher rewards on average? "
    "Choose between {a} and {b}, and output like <answer> {a} </answer> or <answer> {b} "
    "</answer>.\n"
)
_PROMPT_NAMES = re.compile(r"There are 2 arms, named (\S+) and (\S+)\n")


@struct.dataclass
class BanditState:
  pair: jax.Array  # int32 index into ARM_NAMES[split]
  hi_first: jax.Array  # bool: action 0 is the high-risk arm
  last_action: jax.Array  # int32, -1 before the pull
  last_reward: jax.Array  # float32
  done: jax.Array  # bool


@dataclasses.dataclass(frozen=True)
class Bandit(base.Env):
  """Two named arms; `action_names_for(state)` gives the names in action order."""

  name = "bandit"
  action_names = ("first arm", "second arm")

  split: Annotated[str, OneOf(tuple(sorted(ARM_NAMES)))] = "train"
  lo_arm_score: FiniteFloat = 0.1
  hi_arm_hiscore: FiniteFloat = 1.0
  hi_arm_loscore: FiniteFloat = 0.0
  hi_arm_hiscore_prob: UnitFloat = 0.25

  def __post_init__(self):
    check_fields(self, self.name)

  @property
  def pairs(self) -> Tuple[Tuple[str, str], ...]:
    return ARM_NAMES[self.split]

  def reset(self, key: jax.Array) -> BanditState:
    k_pair, k_order = jax.random.split(key)
    pair = jax.random.randint(k_pair, (), 0, len(self.pairs))
    hi_first = jax.random.uniform(k_order) < 0.5
    return BanditState(pair, hi_first, jnp.int32(-1), jnp.float32(0.0), jnp.bool_(False))

  def step(self, key, state: BanditState, action) -> base.StepResult:
    action = jnp.asarray(action, jnp.int32)
    valid = (action >= 0) & (action < 2)
    active = valid & ~state.done
    pulled_hi = (action == 0) == state.hi_first
    hi_payout = jnp.where(
        jax.random.uniform(key) < self.hi_arm_hiscore_prob, self.hi_arm_hiscore, self.hi_arm_loscore
    )
    reward = jnp.where(pulled_hi, hi_payout, self.lo_arm_score)
    reward = jnp.where(active, reward, 0.0).astype(jnp.float32)
    new_state = BanditState(
        state.pair,
        state.hi_first,
        jnp.where(active, action, state.last_action),
        jnp.where(active, reward, state.last_reward),
        state.done | active,
    )
    info = {"success": active & pulled_hi, "action_is_valid": valid, "action_is_effective": active}
    return new_state, reward, new_state.done, info

  def action_names_for(self, state: BanditState) -> Tuple[str, str]:
    pair, hi_first = jax.device_get((state.pair, state.hi_first))
    lo, hi = self.pairs[int(pair)]
    return (hi, lo) if bool(hi_first) else (lo, hi)

  def expert(self, state: BanditState) -> Tuple[List[int], str]:
    """The high-risk arm: its expected payout (0.25 by default) beats the safe arm's 0.1."""
    names = self.action_names_for(state)
    hi = 0 if bool(state.hi_first) else 1
    return [hi], f"{names[hi]} is the riskier arm with the higher expected reward."

  def render(self, state: BanditState, fmt: str = "grid") -> str:
    """The prompt before the pull; RAGEN's `<name>: <reward> points` after it."""
    base.check_format(fmt)
    names = self.action_names_for(state)
    last, reward = jax.device_get((state.last_action, state.last_reward))
    if int(last) >= 0:
      return f"{names[int(last)]}: {round(float(reward), 6)} points"
    return PROMPT.format(a=names[0], b=names[1])

  def from_text(self, text: str) -> BanditState:
    match = _PROMPT_NAMES.search(text)
    if match is None:
      raise ValueError("Bandit text must be the prompt that names both arms.")
    a, b = match.groups()
    for i, (lo, hi) in enumerate(self.pairs):
      if {a, b} == {lo, hi}:
        return BanditState(
            jnp.int32(i), jnp.bool_(a == hi), jnp.int32(-1), jnp.float32(0.0), jnp.bool_(False)
        )
    raise ValueError(f"Arms {a!r} and {b!r} are not a pair of the {self.split!r} split.")
