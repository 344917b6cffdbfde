"""Test-wide settings: strict JAX shape rules and reproducible property tests."""
import os

import hypothesis
import jax

# Implicit rank promotion hides shape bugs (a [B] array meeting a [B, 1] one); tests forbid it.
jax.config.update("jax_numpy_rank_promotion", "raise")

# CI replays the same examples every run so a red build is reproducible; locally hypothesis
# keeps exploring new ones.
hypothesis.settings.register_profile("ci", derandomize=True, deadline=None,
                                     print_blob=True)
hypothesis.settings.register_profile("dev", deadline=None, print_blob=True)
hypothesis.settings.load_profile("ci" if os.environ.get("CI") else "dev")
