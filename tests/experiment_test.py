"""Configs: every shipped file validates, overrides and typos, and clear errors for bad values."""

import glob
import json
import os
import subprocess
import sys

import pytest

from ragen_jax import models
from ragen_jax.config import sections
from ragen_jax.config import drift
from ragen_jax.config import schema
from ragen_jax.config import cli
from ragen_jax.train import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.py")))


def load(name, variant=None):
  spec = os.path.join(ROOT, "configs", f"{name}.py") + (f":{variant}" if variant else "")
  return cli.load_config_file(spec)


def test_the_issue_lists_configs_exist():
  names = {os.path.basename(p)[:-3] for p in CONFIGS}
  assert names >= {
      "sokoban_ppo",
      "sokoban_grpo",
      "frozenlake_ppo",
      "frozenlake_grpo",
      "bandit_ppo",
      "bandit_grpo",
      "sokoban_starpo_s",
      "sokoban_sft",
  }


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
@pytest.mark.parametrize("variant", [None, "smoke"])
def test_every_config_validates(path, variant):
  exp = schema.from_config(cli.load_config_file(path + (f":{variant}" if variant else "")))
  assert exp.train_episodes % exp.ppo.num_minibatches == 0
  assert all(e.train_groups >= 1 for e in exp.envs)


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_every_config_validates_at_real_model_scale(path, tmp_path):
  """The values the model and hardware variants write pass every range check too."""
  (tmp_path / "config.json").write_text("{}")  # all from_config asks of a checkpoint directory
  config = cli.load_config_file(path + ":model=qwen2.5-3b,hw=h100")
  config.model.checkpoint = str(tmp_path)
  exp = schema.from_config(config)
  assert exp.ppo.critic == "shared" and exp.ppo.vf_coef == 0.1 and exp.model.remat


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
@pytest.mark.parametrize("variant", ["smollm2", "smollm2,smoke", "smollm2-full"])
def test_every_config_trains_the_fetched_model(path, variant, tmp_path, monkeypatch):
  """`:smollm2` names the fetched file in the cache, with LoRA unless `-full`."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  gguf_file = models.fetch.path("smollm2-135m-instruct")
  os.makedirs(os.path.dirname(gguf_file))
  open(gguf_file, "wb").close()  # all from_config asks of a GGUF checkpoint
  exp = schema.from_config(cli.load_config_file(f"{path}:{variant}"))
  assert exp.model.checkpoint == gguf_file and exp.model.preset == "smollm2-135m"
  assert exp.model.lora.rank == (0 if variant.endswith("full") else 64)
  assert exp.sft.steps == 0 and not exp.model.warm_start and exp.model.dtype == "float32"


def test_a_fetched_model_not_yet_fetched_says_how(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  with pytest.raises(ValueError, match="python -m ragen_jax.models.fetch smollm2-135m-instruct"):
    schema.from_config(load("frozenlake_ppo", "smollm2"))


def test_starpo_s_filters_without_kl_and_clips_higher():
  exp = schema.from_config(load("sokoban_starpo_s"))
  assert exp.ppo.filter_strategy == "top_k" and exp.ppo.filter_value == 0.25
  assert not exp.ppo.use_kl_loss and (exp.ppo.clip_low, exp.ppo.clip_high) == (0.2, 0.28)


def test_qwen_variant_needs_a_checkpoint_directory(tmp_path):
  config = load("sokoban_ppo", "qwen2.5-0.5b")
  with pytest.raises(ValueError, match="--config.model.checkpoint"):
    schema.from_config(config)
  with config.unlocked():
    config.model.checkpoint = str(tmp_path)
  with pytest.raises(ValueError, match="no config.json"):
    schema.from_config(config)


def test_unknown_variant_is_named():
  with pytest.raises(ValueError, match="valid: smoke"):
    load("sokoban_ppo", "smok")


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("envs.sokoban.name", "sokobn", "Unknown environment .sokobn.; valid names"),
        ("envs.sokoban.render_format", "pixels", "render_format"),
        ("envs.sokoban.sft_batches", 0, "envs.sokoban.sft_batches must be an integer >= 1"),
        ("envs.sokoban.max_tokens_hint", 0, "envs.sokoban: .*max_tokens_hint must be an integer"),
        ("ppo.num_minibatches", 5, "not divisible by num_minibatches"),
        ("ppo.adv_estimator", "ppo", "adv_estimator must be one of"),
        ("ppo.clip_low", 1.5, "clip_low"),
        ("rollout.max_context", 10, "max_context must exceed"),
        ("sft.random_prob", 2.0, "random_prob"),
        ("model.preset", "huge", "model.preset 'huge' is unknown"),
        ("model.dtype", "int8", "model.dtype"),
        ("model.param_dtype", "float16", r"model.param_dtype 'float16' not in \('float32'"),
        ("ppo.moment_dtype", "float16", "ppo.moment_dtype must be one of"),
        ("sft.undo_prob", -0.5, "undo_prob"),
    ],
)
def test_bad_values_raise_clear_errors(key, value, message):
  config = load("sokoban_ppo")
  section, _, name = key.rpartition(".")
  node = config
  for part in section.split("."):
    node = node[part]
  with config.unlocked():
    node[name] = value
  with pytest.raises(ValueError, match=message):
    schema.from_config(config)


def test_unknown_env_option_is_named():
  config = load("sokoban_ppo")
  with config.unlocked():
    config.envs.sokoban.options.num_boxs = 2
  with pytest.raises(ValueError, match="num_boxs"):
    schema.from_config(config)


def test_sokoban_rewards_are_config_knobs_reaching_the_env():
  config = load("sokoban_ppo")
  assert schema.from_config(config).envs[0].make().step_reward == pytest.approx(-0.1)
  config.envs.sokoban.options.step_reward = 0  # an int override, as from the command line
  config.envs.sokoban.options.solved_reward = 5.0
  env = schema.from_config(config).envs[0].make()
  assert (env.step_reward, env.box_on_target_reward, env.solved_reward) == (0.0, 1.0, 5.0)


def test_validation_options_override_training_options_for_validation_only():
  section = sections.env("sokoban", options=dict(search_depth=6), val_options=dict(search_depth=40))
  config = load("sokoban_ppo")
  config.envs.sokoban = section
  spec = schema.from_config(config).envs[0]
  assert (spec.make().search_depth, spec.make(validation=True).search_depth) == (6, 40)
  assert spec.make(validation=True).num_boxes == spec.make().num_boxes == 1
  with pytest.raises(
      ValueError, match=r"val_options\.serch_depth; valid keys there: .*search_depth"
  ):
    sections.env("sokoban", val_options=dict(serch_depth=40))


def test_override_typos_name_the_valid_keys():
  config = load("sokoban_ppo")
  cli.check_overrides(config, ["--config.rollout.group_size=4", "--workdir=x"])
  with pytest.raises(
      ValueError, match=r"rollout has no 'group_sze'; valid keys there: .*group_size"
  ):
    cli.check_overrides(config, ["--config.rollout.group_sze=4"])
  with pytest.raises(ValueError, match=r"the config has no 'rollot'"):
    cli.check_overrides(config, ["--config.rollot.group_size=4"])


def test_launch_rejects_a_typo_before_doing_anything(tmp_path):
  proc = subprocess.run(
      [
          sys.executable,
          "launch.py",
          "--config=configs/sokoban_ppo.py:smoke",
          "--config.trainer.total_step=3",
          f"--workdir={tmp_path / 'w'}",
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=120,
      check=False,
  )
  assert proc.returncode == 2
  assert "trainer has no 'total_step'" in proc.stderr and "total_steps" in proc.stderr
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--config=configs/sokoban_ppo.py:smok"], "unknown or repeated config variant 'smok'"),
        (["--config=configs/nope.py"], "config file 'configs/nope.py' not found"),
        (
            ["--config=configs/sokoban_ppo.py:smoke", "--config.rollout.group_size=abc"],
            "flag --config.rollout.group_size=abc: invalid literal for int()",
        ),
        (["--config=configs/sokoban_ppo.py:smoke", "--no_such_flag=1"], "no_such_flag"),
    ],
)
def test_a_wrong_command_ends_in_one_line_before_anything_runs(args, message, tmp_path):
  """The config is loaded once, by absl's parse; when that fails the command says why in one
  line with the command's status (no traceback, no workdir)."""
  proc = subprocess.run(
      [sys.executable, "launch.py", *args, f"--workdir={tmp_path / 'w'}"],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=120,
      check=False,
  )
  assert proc.returncode == 2, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and message in last and "Traceback" not in proc.stderr
  assert not (tmp_path / "w").exists()


def test_the_default_workdir_names_the_config_and_its_variant():
  assert cli.default_workdir("configs/sokoban_ppo.py") == os.path.join("runs", "sokoban_ppo")
  assert cli.default_workdir("configs/sokoban_ppo.py:model=qwen2.5-3b,hw=h100") == os.path.join(
      "runs", "sokoban_ppo_model-qwen2.5-3b_hw-h100"
  )


def test_a_run_saved_before_keys_were_added_still_opens(tmp_path):
  """A stored config lacking keys (and a whole section) added since gets today's defaults."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from ragen_jax import checkpoints  # pylint: disable=g-import-not-at-top
  from ragen_jax.train import restore  # pylint: disable=g-import-not-at-top

  stored = json.loads(load("sokoban_ppo").to_json())
  for section, key in (
      ("rollout", "unchanged_penalty"),
      ("ppo", "positive_advantages_only"),
      ("sft", "undo_prob"),
  ):
    del stored[section][key]
  del (
      stored["envs"]["sokoban"]["sft_batches"],
      stored["envs"]["sokoban"]["options"]["num_candidates"],
  )
  del stored["early_stop"]
  stored["ppo"]["actor_lr"] = 3e-4  # a stored value wins over today's
  ckpt = checkpoints.Checkpointer(str(tmp_path / "checkpoints"))
  ckpt.save(3, {"x": np.zeros(2, np.float32)}, {"config": json.dumps(stored)})
  ckpt.close()
  config, _, step = restore.run_config(str(tmp_path))
  assert step is None
  exp = schema.from_config(config)
  assert exp.sft.undo_prob == 0.0 and exp.envs[0].sft_batches == 1
  assert not exp.ppo.positive_advantages_only and exp.rollout.unchanged_penalty == 0.0
  assert exp.early_stop.reward_std_collapse == "stop" and exp.ppo.actor_lr == 3e-4
  assert exp.envs[0].make().num_candidates == 4 and exp.envs[0].make().dim_room == (6, 6)
  assert exp.rollout.group_size == 8 and exp.rollout.max_new_tokens == 48  # the run's, not RAGEN's


def test_a_stored_key_that_no_longer_exists_is_named(tmp_path):
  stored = json.loads(load("sokoban_ppo").to_json())
  stored["ppo"]["retired_knob"] = 1
  with pytest.raises(ValueError, match="retired_knob"):
    schema.from_config(drift.stored_config(stored))


@pytest.mark.parametrize("name, cls_exclude", list(schema.SECTIONS.items()))
def test_each_section_is_its_dataclass(name, cls_exclude):
  """Every field is a key and back: the dataclass is the one declaration of a knob."""
  cls, exclude = cls_exclude
  config = sections.experiment(None, envs={"sokoban": sections.env("sokoban")}, cpu_scale=False)
  assert set(config[name].keys()) == set(schema.section_keys(cls, exclude))
  exp = schema.from_config(config)
  assert getattr(exp, name) == cls()


def test_env_section_options_are_the_environment_fields():
  from ragen_jax import envs  # pylint: disable=g-import-not-at-top

  section = sections.env("frozenlake", options=dict(size=6))
  assert set(section.options.keys()) == {
      "size",
      "p",
      "success_rate",
      "is_slippery",
      "max_steps",
      "num_candidates",
  }
  spec = schema.from_config(
      sections.experiment(None, envs={"lake": section}, cpu_scale=False)
  ).envs[0]
  assert spec.make() == envs.make("frozenlake", size=6) and spec.tag == "lake"
  with pytest.raises(ValueError, match=r"envs\(frozenlake\).options.sise"):
    sections.env("frozenlake", options=dict(sise=6))


def test_variants_compose():
  named = load("sokoban_ppo", "qwen2.5-3b-h100")
  keyed = load("sokoban_ppo", "hw=h100,model=qwen2.5-3b")
  assert named.to_json() == keyed.to_json()
  assert named.model.preset == "qwen2.5-3b" and named.model.remat and named.ppo.critic == "shared"
  both = load("sokoban_ppo", "model=qwen2.5-0.5b,smoke")
  assert both.model.preset == "qwen2.5-0.5b" and both.model.dtype == "bfloat16"
  assert both.rollout.max_new_tokens == 24 and both.trainer.total_steps == 4  # smoke last
  assert load("sokoban_ppo", "smoke").to_json() == load("sokoban_ppo", "debug").to_json()


def test_bf16_variants_keep_ragens_batch_with_float32_moments():
  named = load("sokoban_ppo", "qwen2.5-3b-h100-bf16")
  assert named.to_json() == load("sokoban_ppo", "params=bf16,model=qwen2.5-3b,hw=h100").to_json()
  assert (named.model.param_dtype, named.ppo.moment_dtype) == ("bfloat16", "float32")
  assert named.rollout.group_size == 16 and named.ppo.critic == "shared"  # RAGEN's 8 x 16
  assert load("sokoban_ppo", "qwen2.5-3b-h100").rollout.group_size == 8  # float32: 64 episodes
  seven = load("sokoban_ppo", "qwen2.5-7b-h100-bf16")
  assert seven.model.param_dtype == "bfloat16" and seven.ppo.critic == "shared"
  assert load("sokoban_ppo").model.param_dtype == "float32"  # the default


@pytest.mark.parametrize(
    "arg, message",
    [
        ("model=qwen9", "unknown or repeated config variant 'model=qwen9'"),
        ("hw=h100", "hw= sizes a real model"),
        ("params=bf16", "params= sizes a real model"),
        ("qwen2.5-3b-h100-fp8", "unknown or repeated config variant 'qwen2.5-3b-h100-fp8'"),
        ("smoke,smoke", "repeated"),
        ("size=big", "model=.*hw=.*joined by commas"),
    ],
)
def test_bad_variants_are_named(arg, message):
  with pytest.raises(ValueError, match=message):
    load("sokoban_ppo", arg)


def test_a_vision_language_model_plays_only_environments_drawn_as_images(tmp_path):
  """Refused before anything is built, as a ConfigError naming the tags: a Qwen2.5-VL (the tiny
  preset, or the 3B variant's checkpoint) on text environments, a text model on visual ones."""
  (tmp_path / "vl3b").mkdir()
  (tmp_path / "vl3b" / "config.json").write_text(
      json.dumps(models.hf_config.to_hf_dict(models.get_config("qwen2.5-vl-3b")))
  )
  vl_on_text = load("sokoban_ppo", "smoke")
  vl_on_text.model.preset, vl_on_text.model.warm_start = "tiny-vl", False
  variant_on_text = load("frozenlake_ppo", "qwen2.5-vl-3b-h100-bf16")
  variant_on_text.model.checkpoint = str(tmp_path / "vl3b")
  text_on_visual = load("visual_sokoban_ppo", "smoke")
  text_on_visual.model.preset = "tiny"
  for config, message in (
      (vl_on_text, r"'tiny-vl' is a vision-language model .* envs \['sokoban'\] are text"),
      (variant_on_text, r"vl3b' is a vision-language model .* envs \['frozenlake'\] are text"),
      (text_on_visual, r"envs \['visual_sokoban'\] are drawn as images .* 'tiny'"),
  ):
    with pytest.raises(trainer.ConfigError, match=message):
      trainer.train(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()  # nothing written
  visual = schema.from_config(load("visual_sokoban_ppo", "smoke"))
  schema.check_images(visual, models.get_config("tiny-vl"))  # the shipped pairing passes
