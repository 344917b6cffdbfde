"""A run's configuration: the schema, the ConfigDicts of `configs/*.py`, their variants,
resuming under another config, and the command line's load.

    schema     one dataclass per section; `from_config(config) -> Experiment`
    sections   `experiment(...)`, `env(...)`: the ConfigDicts config files return, derived from
               the schema's dataclasses
    variants   `configs/x.py:<arg>`: a real model, its precision, its card, test sizes
    drift      which keys a resumed run may change; a stored config on today's defaults
    cli        `--config=...` and its overrides, loaded once; `load_config_file`
"""
