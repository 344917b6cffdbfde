"""The text-environment contract: any Python environment, stepped on the host, on strings.

    class GuessNumber(envs.TextEnv):
      instruction = "Guess the hidden number between 1 and 100."
      def reset(self, seed):
        self.target = random.Random(seed).randint(1, 100)
        return "Guess a number."
      def step(self, action):
        ...
        return observation, reward, done, {"success": ...}

RAGEN's and gym's contract on strings:
  reset(seed: int) -> str           the first observation; the same seed gives the same start
                                    (an env group shares its seed, hence its start)
  step(action: str) -> (str, float, bool, dict)   observation, reward, done, info
Optional attributes, read from the instance after `reset` (so they may depend on the episode):
  instruction          system-prompt text (RAGEN's env_instruction)
  action_names         a finite vocabulary: answer words are matched to it ignoring case, unknown
                       words cost the format penalty, and `step` receives the canonical name.
                       None: free text, every parsed answer goes to `step` verbatim.
  max_actions_per_turn answers stepped per turn (default: the rollout's; free text: 1)
  close()              called once the episode is over
  expert()             -> (answers or None, thought): this turn's answers of a solver, as `step`
                       takes them, and a short reasoning text; the scripted demonstrator of the
                       supervised warm start (ragen_jax.warm_start.demos)
`info` may carry `success`, `action_is_valid` and `action_is_effective` (bools); the rollout's
metrics use them when present (defaults: no success, valid, effective).

Subclassing `TextEnv` is optional: any object with `reset` and `step` works. One instance plays
one episode; `ragen_jax.envs.register` and the config's `envs.<tag>.entry` name a factory (a
class or function) that is called with the tag's `options` once per episode.
"""

from typing import Any, Dict, Optional, Sequence, Tuple

StepOutput = Tuple[str, float, bool, Dict[str, Any]]


class TextEnv:
  """Base class of host environments on strings; see the module doc."""

  instruction: str = ""
  action_names: Optional[Sequence[str]] = None
  max_actions_per_turn: Optional[int] = None

  def reset(self, seed: int) -> str:
    raise NotImplementedError

  def step(self, action: str) -> StepOutput:
    raise NotImplementedError

  def close(self) -> None:
    pass
