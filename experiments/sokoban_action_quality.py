r"""How often a Sokoban policy's move is one an optimal solver would make.

  python -m experiments.sokoban_action_quality RUN/eval/step_0.jsonl [RUN2/eval/step_15.jsonl ...]
  python -m experiments.sokoban_action_quality --random_play=5     # chance on the default's levels

Success rates on 64 validation levels move in steps of 1.6 points and mix planning with luck; this
asks a sharper question of the same trajectories (the `eval/step_N.jsonl` files a run writes). For
every turn whose state is still solvable within `--depth` moves, the reply's first action is optimal
when it shortens the breadth-first solution (`envs.device.sokoban.solve`) by exactly one move. The
same states also give the share a uniformly random first action would reach, so the figure can be
read against chance; `--random_play=N` also plays the config's validation levels (of `--env`, any
environment) N times with uniformly random actions: the success of chance. Used in
experiments/README.md to tell a policy that plans from one that guesses.

It also counts how a policy gets stuck (`loop_stats`): replies whose second move undoes the
first (Up || Down), and turns after which the board is unchanged. A near-greedy policy (RAGEN
validates at temperature 0.5) that meets the same board again gives the same reply, so such a
turn usually repeats until the episode's turns run out.
"""

import argparse
import json
import re
from typing import Dict, Iterable, List

import jax

from ragen_jax import envs
from ragen_jax import tokenizers
from ragen_jax.envs.device import sokoban
from ragen_jax.rollout import prompts
from ragen_jax.warm_start import demos
from ragen_jax.config import schema
from ragen_jax.config import cli
from ragen_jax.train import validation

_GRID = re.compile(r"Grid Map: *\n(.*?)\n(?:You have|$)", re.S)


def turn_states(rows: Iterable[dict]):
  """Yields (grid text shown to the policy, its reply) for every Sokoban turn."""
  for row in rows:
    if row.get("env") != "sokoban":
      continue
    messages = row["messages"]
    for prev, msg in zip(messages, messages[1:]):
      if msg["role"] == "assistant" and prev["role"] == "user":
        match = _GRID.search(prev["content"])
        if match:
          yield match.group(1).strip("\n"), msg["content"]


_OPPOSITE = {a.lower(): b.lower() for a, b in demos.OPPOSITE.items()}  # replies' words, lowered


def loop_stats(rows: Iterable[dict]) -> Dict[str, float]:
  """{'replies', 'undo_share', 'turns', 'stuck_share', 'failed', 'failed_stuck_share'} over the
  Sokoban episodes of `rows`: the share of replies holding a move followed by its opposite, of
  turns after which the next grid equals this one, and of failed episodes with such a turn."""
  replies = undo = turns = stuck = failed = failed_stuck = 0
  for row in rows:
    if row.get("env") != "sokoban":
      continue
    turns_of_row = list(turn_states([row]))
    for _, reply in turns_of_row:
      words = [w.lower() for w in prompts.parse_response(reply, True, "||", 10).actions]
      if words:
        replies += 1
        undo += any(_OPPOSITE.get(a) == b for a, b in zip(words, words[1:]))
    same = [a == b for (a, _), (b, _) in zip(turns_of_row, turns_of_row[1:])]
    turns += len(same)
    stuck += sum(same)
    if not row["success"]:
      failed += 1
      failed_stuck += any(same)
  if not replies:
    raise ValueError("no Sokoban replies in these trajectories")
  return {
      "replies": replies,
      "undo_share": undo / replies,
      "turns": turns,
      "stuck_share": stuck / max(turns, 1),
      "failed": failed,
      "failed_stuck_share": failed_stuck / max(failed, 1),
  }


def action_quality(rows: Iterable[dict], env=None, depth: int = 20) -> Dict[str, float]:
  """{'turns', 'optimal_share', 'random_share'} over the solvable turns of `rows`."""
  env = env or envs.make("sokoban")
  step = jax.jit(env.step)
  key = jax.random.key(0)  # Sokoban's step is deterministic; the key is unused.
  turns, optimal, random_share = 0, 0, 0.0
  for grid, reply in turn_states(rows):
    state = env.from_text(grid)
    plan = sokoban.solve(state, depth)
    if not plan:  # unsolvable within depth (or already solved): no optimal move
      continue
    good: List[bool] = []
    for a in range(env.num_actions):
      after = sokoban.solve(step(key, state, a)[0], depth)
      good.append(after is not None and len(after) == len(plan) - 1)
    turns += 1
    random_share += sum(good) / len(good)
    words = prompts.parse_response(reply, True, "||", 1).actions
    chosen, _ = prompts.match_actions(words, env.action_names)
    optimal += bool(chosen) and good[chosen[0]]
  if not turns:
    raise ValueError("no solvable Sokoban turns in these trajectories")
  return {"turns": turns, "optimal_share": optimal / turns, "random_share": random_share / turns}


def random_play_success(
    config_spec: str,
    plays: int,
    random_prob: float = 1.0,
    env_name: str = "sokoban",
    levels: int | None = None,
) -> List[float]:
  """Success of uniformly random actions on the config's validation levels of `env_name` (its
  first `levels` of them when given), per play (`random_prob` < 1 mixes in the expert's moves,
  as the demonstrations do)."""
  config = cli.load_config_file(config_spec)
  for section in config.envs.values():
    section.val_groups = levels or section.val_groups
  exp = schema.from_config(config)
  spec = next((e for e in exp.envs if e.name == env_name), None)
  if spec is None:
    raise ValueError(f"{config_spec} has no {env_name} environment")
  engine = validation.engines(exp, tokenizers.load("sentencepiece"))[spec.tag]
  out = []
  for play in range(plays):
    policy = demos.expert_policy(engine.env, engine.config, random_prob, seed=play)
    wins = []
    for _, seed, keep in validation.batches(exp, spec, engine):
      result = engine.run_scripted(policy, jax.random.key(play), seed)
      wins.extend(float(x) for x in result.metrics["success"][:keep])
    out.append(sum(wins) / len(wins))
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("files", nargs="*", help="eval/step_N.jsonl files of runs")
  parser.add_argument("--depth", type=int, default=20, help="solver depth limit (moves)")
  parser.add_argument(
      "--random_play",
      type=int,
      default=0,
      help="also play the validation levels this many times at random",
  )
  parser.add_argument(
      "--config",
      default="configs/sokoban_ppo.py",
      help="config whose validation levels --random_play plays",
  )
  parser.add_argument("--env", default="sokoban", help="environment --random_play plays")
  args = parser.parse_args(argv)
  if args.random_play:
    wins = random_play_success(args.config, args.random_play, env_name=args.env)
    print(
        f"random play on {args.config}'s {args.env} validation levels: success "
        + ", ".join(f"{w:.1%}" for w in wins)
        + f" (mean {sum(wins) / len(wins):.1%})"
    )
  if args.files:
    print(
        "| file | success | solvable turns | first action optimal | random first action | "
        "replies that undo a move | turns leaving the board unchanged | failures with one |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
  for path in args.files:
    with open(path, encoding="utf-8") as f:
      rows = [json.loads(line) for line in f]
    q, loops = action_quality(rows, depth=args.depth), loop_stats(rows)
    success = [bool(r["success"]) for r in rows if r.get("env") == "sokoban"]
    print(
        f"| {path} | {sum(success) / len(success):.1%} | {q['turns']} | "
        f"{q['optimal_share']:.1%} | {q['random_share']:.1%} | {loops['undo_share']:.1%} | "
        f"{loops['stuck_share']:.1%} | {loops['failed_stuck_share']:.1%} |"
    )


if __name__ == "__main__":
  main()
