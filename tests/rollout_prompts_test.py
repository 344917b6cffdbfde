"""RAGEN prompt text and reply parsing: hand-worked cases and hypothesis properties.

No arrays here (host-side text only), so no dimension legend beyond A = actions per turn.
"""

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import pytest

from ragen_jax import envs
from ragen_jax.rollout import prompts

NAMES = ("Up", "Down", "Left", "Right")


@pytest.mark.parametrize(
    "text,actions,matched",
    [
        ("<think>go</think><answer>Up || left</answer>", ("Up", "left"), True),
        ("<think>a</think> \n <answer> Right||Right||Up </answer>", ("Right", "Right"), True),
        ("<think></think><answer></answer>", (), True),
        ("<think>x</think><answer> || Up ||  || </answer> trailing", ("Up",), True),
        ("<think>x</think><answer>Up<|im_end|> || <answer>Down</answer>", ("Up", "Down"), True),
        ("<answer>Up</answer>", (), False),  # no think block
        ("<think>x</think> words <answer>Up</answer>", (), False),  # text between the blocks
        ("<think>x</think><answer>Up", (), False),  # unclosed
        ("", (), False),
        ("<think>a</think><answer>b</answer><think>c</think><answer>Up</answer>", ("b",), True),
    ],
)
def test_hand_worked_parses(text, actions, matched):
  parsed = prompts.parse_response(text, enable_think=True, action_sep="||", max_actions=2)
  assert parsed == prompts.Parsed(actions, matched)


def test_no_think_mode_and_matching():
  parsed = prompts.parse_response("<answer>UP || jump</answer>", enable_think=False, max_actions=3)
  assert parsed.actions == ("UP", "jump") and parsed.matched
  assert prompts.match_actions(parsed.actions, NAMES) == ([0], 1)
  assert prompts.turn_penalised(parsed, 1)
  ok = prompts.parse_response("<think>t</think><answer>down||RIGHT</answer>")
  assert prompts.match_actions(ok.actions, NAMES) == ([1, 3], 0)
  assert not prompts.turn_penalised(ok, 0)
  empty = prompts.parse_response("<think>t</think><answer> </answer>")
  assert prompts.turn_penalised(empty, 0)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "<think>",
                "</think>",
                "<answer>",
                "</answer>",
                "||",
                "Up",
                "dOWN",
                " ",
                "\n",
                "<|im_end|>",
                "\x00",
                "\ufffd",
                "<",
                "/",
            ]
        )
        | st.text(max_size=6),
        max_size=40,
    ).map("".join),
    st.integers(1, 4),
)
def test_any_text_parses_without_raising(text, max_actions):
  parsed = prompts.parse_response(text, max_actions=max_actions)
  assert len(parsed.actions) <= max_actions
  assert all(a and a == a.strip() for a in parsed.actions)
  indices, invalid = prompts.match_actions(parsed.actions, NAMES)
  assert len(indices) + invalid == len(parsed.actions)
  if not parsed.matched:
    assert parsed.actions == () and prompts.turn_penalised(parsed, invalid)


_SPACE = st.sampled_from(["", " ", "  ", "\n", "\t"])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.booleans(), _SPACE, _SPACE), min_size=1, max_size=5),
    st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=30),
    st.integers(1, 3),
)
def test_well_formed_answers_round_trip(words, thought, max_actions):
  written = [(NAMES[i].upper() if upper else NAMES[i].lower(), a, b) for i, upper, a, b in words]
  answer = "||".join(f"{a}{w}{b}" for w, a, b in written)
  parsed = prompts.parse_response(
      f"<think>{thought}</think>\n<answer>{answer}</answer>", max_actions=max_actions
  )
  expected = [i for i, *_ in words][:max_actions]
  indices, invalid = prompts.match_actions(parsed.actions, NAMES)
  assert parsed.matched and indices == expected and invalid == 0
  assert not prompts.turn_penalised(parsed, invalid)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 3), st.sampled_from(["jump", "upp", "U p", "north", "1"]))
def test_an_unknown_word_is_penalised(index, junk):
  parsed = prompts.parse_response(f"<think>t</think><answer>{NAMES[index]} || {junk}</answer>")
  indices, invalid = prompts.match_actions(parsed.actions, NAMES)
  assert indices == [index] and invalid == 1 and prompts.turn_penalised(parsed, invalid)


def test_system_and_turn_prompts_are_ragens_text():
  env = envs.make("frozenlake")
  system = prompts.system_prompt(env.instruction("grid"), env.grid_vocab, env.action_names, 10)
  assert system == (
      "You're a helpful assistant. You are solving the FrozenLake puzzle. Forbid the whole and "
      "go to the target. You may move to the unintended direction due to the slippery ice. "
      "Example answer format: <think>To forbid the hole and go to the target, I should go left "
      "then go up.</think><answer>Left || Up</answer>\nThe meaning of each symbol in the state "
      "is:\nP: player, _: empty, O: hole, G: goal, X: player in hole, √: player on goal\nYour "
      "available actions are:\nLeft, Down, Right, Up\nYou can make up to 10 actions, separated "
      'by the action separator " || "\n'
  )
  assert prompts.turn_prompt(2, "P_\n_G", 8, True, 120) == (
      "\nTurn 2:\nState:\nP_\n_G\nYou have 8 actions left. Always output: "
      "<think>...</think><answer>...</answer> with no extra text. Strictly follow this format. "
      "Max response length: 120 words (tokens).\n"
  )
  compact = prompts.system_prompt(
      env.instruction("grid"),
      env.grid_vocab,
      env.action_names,
      10,
      enable_think=False,
      style="compact",
  )
  assert compact == system + (
      "Always output: <answer>...</answer> with no extra text. Strictly follow this format. "
      "Max response length: 100 words (tokens).\n"
  )
  assert (
      prompts.turn_prompt(2, "P_\n_G", 8, style="compact") == "\nTurn 2:\nP_\n_G\nActions left: 8\n"
  )
  assert prompts.reward_prompt(-0.1 + 0.0) == "Reward:\n-0.1\n"
  assert prompts.reward_prompt(10.9) == "Reward:\n10.9\n"
  coord = envs.make("sokoban", dim_room=(7, 8)).instruction("grid_coord")
  assert "(6, 7)" in coord
  assert envs.make("bandit").instruction("grid") == ""
