"""Released configs of parts that several families share, as data (fresh dicts of constructor
kwargs), with their sources.

- ``t5_xxl_config``: google/t5-v1_1-xxl's, whose encoder (T5EncoderModel) conditions several
  transformer families (kohya-ss/sd-scripts library/flux_utils.py ``load_t5xxl`` copies it);
- ``ae16_config``: the 16-channel autoencoder without quant convolutions that Black Forest Labs
  released as ae.safetensors (AutoEncoderParams in their repository, as sd-scripts'
  library/flux_models.py copies them), which later families ship unchanged;
- ``video_vae16_config``: the 16-channel video VAE (Wan 2.1's layout) that Qwen-Image released
  and Krea 2 ships too (diffusers' AutoencoderKLQwenImage defaults are its released config);
- ``qwen3_4b_config``: Qwen/Qwen3-4B's (its config.json: architectures Qwen3ForCausalLM), the
  text encoder of Z-Image and FLUX.2 [klein] 4B; query width 32 * 128 = 4096 differs from the
  2560 hidden size, and keys and values use 8 heads (grouped-query attention);
- ``mistral_small_3_text_config``: Mistral Small 3.1 24B's language model, the text encoder of
  FLUX.2 [dev] (its vision tower is never read).
"""

from __future__ import annotations

import inspect

AE16_LATENT_CHANNELS = 16


def t5_xxl_config() -> dict:
    """T5Config kwargs of google/t5-v1_1-xxl."""
    return {
        "vocab_size": 32128,  # the tokenizer has 32100 pieces; the embedding is padded
        "d_model": 4096,
        "d_kv": 64,
        "d_ff": 10240,
        "num_layers": 24,
        "num_decoder_layers": 24,
        "num_heads": 64,
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
        "dropout_rate": 0.1,
        "layer_norm_epsilon": 1e-6,
        "feed_forward_proj": "gated-gelu",  # T5 v1.1: gated GELU ("gelu_new") feed-forward
        "tie_word_embeddings": False,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
    }


def ae16_config() -> dict:
    """AutoencoderKL kwargs of the 16-channel AE (ae.safetensors): 8x down, no quant convs."""
    return {
        "in_channels": 3,
        "out_channels": 3,
        "down_block_types": ("DownEncoderBlock2D",) * 4,
        "up_block_types": ("UpDecoderBlock2D",) * 4,
        "block_out_channels": (128, 256, 512, 512),  # ch 128 * ch_mult (1, 2, 4, 4)
        "layers_per_block": 2,  # num_res_blocks
        "act_fn": "silu",
        "latent_channels": AE16_LATENT_CHANNELS,
        "norm_num_groups": 32,  # GroupNorm(32) throughout
        "sample_size": 1024,  # diffusers' vae/config.json; not a property of the weights
        "scaling_factor": 0.3611,  # latents = (z - shift) * scale
        "shift_factor": 0.1159,
        "force_upcast": True,
        "use_quant_conv": False,
        "use_post_quant_conv": False,
        "mid_block_add_attention": True,
    }


def video_vae16_config() -> dict:
    """AutoencoderKLQwenImage kwargs of the released 16-channel video VAE: the defaults."""
    from diffusers import AutoencoderKLQwenImage

    parameters = inspect.signature(AutoencoderKLQwenImage.__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def qwen3_4b_config() -> dict:
    """Qwen3Config kwargs of Qwen3-4B (its LM head tied to the embeddings)."""
    return {
        "vocab_size": 151936,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "attention_bias": False,
        "tie_word_embeddings": True,
    }


def mistral_small_3_text_config() -> dict:
    """MistralConfig kwargs of Mistral Small 3.1 24B's language model (the ``text_config`` of
    mistralai/Mistral-Small-3.1-24B-Instruct-2503's Mistral3ForConditionalGeneration, FLUX.2
    [dev]'s text encoder): no sliding window, the LM head apart from the embeddings."""
    return {
        "vocab_size": 131072,
        "hidden_size": 5120,
        "intermediate_size": 32768,
        "num_hidden_layers": 40,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
    }
