"""Qwen2 / Qwen3 / Llama 3.x / Qwen2.5-VL policy and critic models, presets, Hugging Face
checkpoint I/O and GGUF loading.

    from ragen_jax import models
    model = models.load_hf("/path/to/Qwen2.5-0.5B-Instruct", dtype=jnp.bfloat16)  # or Qwen3, Llama
    model = models.load_gguf("/path/to/SmolLM2-135M-Instruct.Q4_1.gguf")  # llama.cpp's files
    model = models.load(path)  # either: a GGUF file or a Hugging Face directory
    logits_BxTxV = model(input_ids_BxT, attention_mask=mask_BxT)
    models.save_hf(model, out_dir)
    model = models.create("tiny", jax.random.key(0))
    vl = models.load_hf("/path/to/Qwen2.5-VL-3B-Instruct")  # a Qwen2_5_VL (models/qwen2_5_vl.py)
    logits_BxTxV = vl(input_ids_BxT, mask_BxT, pixel_values=pixels_PxC, image_grid_thw=grid_Nx3)

Dimension legend: B batch, T length, S cache capacity, L layers, D model dim,
H query heads, K kv heads, Dh head dim, V vocab, F mlp dim.
"""

from ragen_jax.models import fetch
from ragen_jax.models import gguf_checkpoint
from ragen_jax.models import hf_config
from ragen_jax.models import lora
from ragen_jax.models import mrope
from ragen_jax.models import qwen2_5_vl
from ragen_jax.models import vision
from ragen_jax.models.build import create
from ragen_jax.models.build import critic_from_policy
from ragen_jax.models.build import model_class
from ragen_jax.models.checkpoint import load
from ragen_jax.models.checkpoint import load_gguf
from ragen_jax.models.checkpoint import load_hf
from ragen_jax.models.checkpoint import save_hf
from ragen_jax.models.config import get_config
from ragen_jax.models.config import kernel_table
from ragen_jax.models.config import layer_table
from ragen_jax.models.config import LoraConfig
from ragen_jax.models.config import ModelConfig
from ragen_jax.models.config import num_params
from ragen_jax.models.config import param_table
from ragen_jax.models.config import PRESETS
from ragen_jax.models.config import RopeScaling
from ragen_jax.models.config import VisionConfig
from ragen_jax.models.kv_cache import init_cache
from ragen_jax.models.kv_cache import KVCache
from ragen_jax.models.kv_cache import LayerCache
from ragen_jax.models.qwen2 import Decoder
from ragen_jax.models.qwen2 import LayerWeights
from ragen_jax.models.qwen2 import Qwen2
from ragen_jax.models.qwen2 import Qwen2Critic
from ragen_jax.models.qwen2_5_vl import ImageInputs
from ragen_jax.models.qwen2_5_vl import prepare_images
from ragen_jax.models.qwen2_5_vl import Qwen2_5_VL
