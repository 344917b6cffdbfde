"""Trains the shipped SentencePiece model on RAGEN-style environment dialogues.

    python -m ragen_jax.tokenizers.train_sentencepiece [--out PATH] [--episodes N]

The corpus is synthesised here, deterministically (Python `random` with a fixed
seed, single-threaded training): system prompts, per-turn user messages with
Sokoban / FrozenLake grids and coordinates, Bandit prompts, and assistant
answers in RAGEN's `<think>...</think><answer>...</answer>` format, all wrapped
in the Qwen chat template (RAGEN prompt format, reference ragen.md §2.2). Grids
are drawn from the symbol tables here (RAGEN's, including variants the
environments do not render) rather than from rendered levels; the Bandit arm
names are the environment's own.
"""

import argparse
import io
import os
import random

import sentencepiece

from ragen_jax.envs.device import bandit
from ragen_jax.models.config import SENTENCEPIECE_VOCAB_SIZE
from ragen_jax.tokenizers import base
from ragen_jax.tokenizers import spm

SOKOBAN_LEGEND = {
    "#": "wall",
    "_": "empty",
    "O": "target",
    "√": "box on target",
    "X": "box",
    "P": "player",
    "S": "player on target",
}
# RAGEN's SokobanDifferentGridVocab symbols (generalisation test).
SOKOBAN_ALT_LEGEND = {
    "W": "wall",
    ".": "empty",
    "G": "target",
    "C": "box on target",
    "B": "box",
    "A": "player",
    "@": "player on target",
}
FROZENLAKE_LEGEND = {
    "P": "player",
    "_": "empty",
    "O": "hole",
    "G": "goal",
    "X": "player in hole",
    "√": "player on goal",
}
SOKOBAN_ACTIONS = ("Up", "Down", "Left", "Right")
FROZENLAKE_ACTIONS = ("Left", "Down", "Right", "Up")
# RAGEN's arm names (the environment's own), and one pair of its examples beyond them.
BANDIT_PAIRS = bandit.ARM_NAMES["train"] + bandit.ARM_NAMES["test"] + (("Phoenix", "Dragon"),)

SOKOBAN_TASK = (
    "You are solving the Sokoban puzzle. You are the player and you need to "
    "push all boxes to targets. When you are right next to a box, you can push "
    "it by moving in the same direction. You cannot push a box through a wall, "
    "and you cannot pull a box. The answer should be a sequence of actions, "
    "like <answer>Right || Right || Up</answer>"
)
FROZENLAKE_TASK = (
    "You are solving the FrozenLake puzzle. Avoid the holes and go to the goal. "
    "You may move in an unintended direction because the ice is slippery. The "
    "answer should be a sequence of actions, like <answer>Right || Right || Up"
    "</answer>"
)
BANDIT_TASK = (
    "You are playing a bandit game. Your goal is to maximize your reward by "
    "choosing the best arm. Each arm has its own reward distribution, related "
    "to its name. Reason about the symbolism of the names before you choose."
)
FORMAT = (
    "Always output: <think> [Your thoughts] </think> <answer> [your answer] "
    "</answer> with no extra text. Strictly follow this format."
)
THOUGHTS = (
    "The box is {d} of me, so I should move {a} to push it toward the target.",
    "I am at ({r}, {c}). The target is {d}. Moving {a} brings me closer.",
    "There is a wall {d}, so I cannot go that way. I will go {a} instead.",
    "The goal is to the {d}. I need to avoid the hole, so I go {a} first.",
    "Pushing the box {a} would put it on the target at ({r}, {c}).",
    "If I move {a} now, the box will not get stuck in the corner.",
    "The player needs to get behind the box first. Let me move {a}.",
    "My last action was not effective. I should try {a} this time.",
    "The hole is {d} of me, which is dangerous. Safer to move {a}.",
    "I think {a} is the best move because the path {d} is blocked.",
)
DIRECTIONS = ("above", "below", "to the left", "to the right", "up", "down", "left", "right")


def _grid(
    rng: random.Random, rows: int, cols: int, legend: dict[str, str], walls: bool
) -> list[list[str]]:
  symbols = list(legend)
  wall, empty = (symbols[0], symbols[1]) if walls else (None, symbols[1])
  grid = []
  for r in range(rows):
    row = []
    for c in range(cols):
      border = walls and (r in (0, rows - 1) or c in (0, cols - 1))
      if border or (walls and rng.random() < 0.25):
        row.append(wall)
      else:
        row.append(empty if rng.random() < 0.8 else rng.choice(symbols[2:]))
    grid.append(row)
  return grid


def _coords(grid: list[list[str]], legend: dict[str, str]) -> str:
  lines = [f"Board size: {len(grid)} rows x {len(grid[0])} cols (zero-indexed)."]
  for symbol, meaning in legend.items():
    cells = [f"({r}, {c})" for r, row in enumerate(grid) for c, s in enumerate(row) if s == symbol]
    if cells and meaning not in ("wall", "empty"):
      lines.append(f"{meaning.capitalize()}: " + ", ".join(cells))
  return "\n".join(lines)


def _answer(rng: random.Random, actions: tuple[str, ...], max_n: int) -> str:
  chosen = [rng.choice(actions) for _ in range(rng.randint(1, max_n))]
  thought = " ".join(
      rng.choice(THOUGHTS).format(
          d=rng.choice(DIRECTIONS), a=chosen[0], r=rng.randint(0, 7), c=rng.randint(0, 7)
      )
      for _ in range(rng.randint(1, 3))
  )
  space = rng.choice(("", " "))
  return (
      f"<think>{space}{thought}{space}</think>{rng.choice(('', ' ', chr(10)))}"
      f"<answer>{space}{' || '.join(chosen)}{space}</answer>"
  )


def _system(task: str, legend: dict[str, str], actions: tuple[str, ...]) -> str:
  text = "You're a helpful assistant. " + task
  if legend:
    text += "\nThe meaning of each symbol in the state is:\n" + ", ".join(
        f"{s}: {m}" for s, m in legend.items()
    )
  return (
      text
      + "\nYour available actions are:\n"
      + ", ".join(actions)
      + "\nYou can make up to 10 actions, separated by the action "
      'separator " || "'
  )


def grid_episode(rng: random.Random, sokoban: bool) -> list[dict[str, str]]:
  """A multi-turn Sokoban or FrozenLake chat with random states and answers."""
  if sokoban:
    legend = rng.choice((SOKOBAN_LEGEND,) * 4 + (SOKOBAN_ALT_LEGEND,))
    task, actions, size = SOKOBAN_TASK, SOKOBAN_ACTIONS, rng.choice((6, 6, 8))
  else:
    legend, task, actions = FROZENLAKE_LEGEND, FROZENLAKE_TASK, FROZENLAKE_ACTIONS
    size = rng.choice((4, 4, 6))
  messages = [{"role": "system", "content": _system(task, legend, actions)}]
  fmt = rng.choice(("grid", "coord", "grid_coord"))
  user, left = "", 10
  for turn in range(1, rng.randint(1, 5) + 1):
    grid = _grid(rng, size, size, legend, walls=sokoban)
    grid_text = "\n".join("".join(row) for row in grid)
    state = {
        "grid": grid_text,
        "coord": _coords(grid, legend),
        "grid_coord": "Coordinates:\n" + _coords(grid, legend) + "\nGrid Map:\n" + grid_text,
    }[fmt]
    if turn > 1:
      user += f"Reward:\n{rng.choice((-0.1, -0.2, 0.0, 0.9, 1.0, 10.8))}\n"
    user += f"\nTurn {turn}:\nState:\n{state}\n"
    if rng.random() < 0.1:
      user += (
          "No valid action provided previously. Environment state remains "
          "the same. Please try again.\n"
      )
    user += (
        f"You have {left} actions left. {FORMAT} Max response length: "
        f"{rng.choice((100, 120, 200))} words (tokens)."
    )
    messages.append({"role": "user", "content": user})
    messages.append({"role": "assistant", "content": _answer(rng, actions, 2)})
    user, left = "", max(left - 2, 1)
  return messages


def bandit_episode(rng: random.Random) -> list[dict[str, str]]:
  """A single-turn Bandit chat."""
  arms = list(rng.choice(BANDIT_PAIRS))
  rng.shuffle(arms)
  prompt = (
      f"You are facing two slot machines, {arms[0]} and {arms[1]}. Each "
      "machine has its own reward distribution related to its name. "
      f"Which one do you pull?\nTurn 1:\nState:\n{arms[0]} or {arms[1]}\n"
      f"You have 1 actions left. {FORMAT} Max response length: 100 words "
      "(tokens)."
  )
  pick = rng.choice(arms)
  answer = (
      f"<think>The name {pick} suggests {rng.choice(('stable', 'risky'))} "
      f"rewards, which seems better in expectation.</think><answer>{pick}"
      "</answer>"
  )
  return [
      {"role": "system", "content": _system(BANDIT_TASK, {}, tuple(arms))},
      {"role": "user", "content": prompt},
      {"role": "assistant", "content": answer},
  ]


def build_corpus(episodes: int = 3000, seed: int = 0) -> list[str]:
  """Chat-formatted training texts (deterministic for a given seed)."""
  rng = random.Random(seed)
  texts = []
  for i in range(episodes):
    kind = i % 5
    messages = (
        bandit_episode(rng) if kind == 4 else grid_episode(rng, sokoban=kind < 2 or kind == 3)
    )
    texts.append(base.render_chatml(messages, add_generation_prompt=False) + base.ENDOFTEXT)
  return texts


def train(
    out_path: str, episodes: int = 3000, seed: int = 0, vocab_size: int = SENTENCEPIECE_VOCAB_SIZE
) -> None:
  """Trains the BPE model and writes it to out_path (a .model file)."""
  model = io.BytesIO()
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(build_corpus(episodes, seed)),
      model_writer=model,
      vocab_size=vocab_size,
      model_type="bpe",
      user_defined_symbols=list(spm.USER_SYMBOLS),
      byte_fallback=True,
      # Lossless: keep text exactly as written (no NFKC, no dummy prefix,
      # whitespace runs and newlines preserved).
      normalization_rule_name="identity",
      add_dummy_prefix=False,
      remove_extra_whitespaces=False,
      allow_whitespace_only_pieces=True,
      character_coverage=1.0,
      max_sentence_length=1 << 16,
      bos_id=-1,
      eos_id=-1,
      pad_id=-1,
      unk_id=0,
      # Determinism: one thread, no sentence sampling or shuffling.
      num_threads=1,
      input_sentence_size=0,
      shuffle_input_sentence=False,
      minloglevel=2,
  )
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  with open(out_path, "wb") as fp:
    fp.write(model.getvalue())


def main():
  default_out = os.path.join(
      os.path.dirname(os.path.dirname(__file__)), "assets", spm.DEFAULT_MODEL
  )
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=default_out)
  parser.add_argument("--episodes", type=int, default=3000)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  train(args.out, args.episodes, args.seed)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
