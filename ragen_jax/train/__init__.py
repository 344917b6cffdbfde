"""The run: the StarPO loop (`trainer.train`), its state, batching, validation, the policy it
builds, the memory estimate, stop signals, reading runs back (`restore`) and the command's exit
statuses (`launch_utils`). Entry point: launch.py; configuration: ragen_jax.config."""
