"""The warm start: supervised fine-tuning of a tiny policy on scripted experts' demonstrations
(`sft.finetune`), played through the rollout engine (`demos`) so they hold a rollout's exact
token layout."""
