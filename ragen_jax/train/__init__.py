"""Training: the StarPO loop (`trainer.train`), typed configs (`experiment`), the warm start
(`demos`, `sft`), validation, and reading runs back (`restore`). Entry point: launch.py."""
