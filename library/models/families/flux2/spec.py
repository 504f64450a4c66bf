"""FLUX.2's loading facts as data (diffusers 0.42.1, Black Forest Labs' and Comfy-Org's files).

- pipelines: Flux2KleinPipeline (klein 4B / 9B, base and distilled: one architecture; the
  distilled repositories' model_index.json adds ``"is_distilled": true``), Flux2Pipeline (dev);
- parts: transformer/ (Flux2Transformer2DModel), vae/ (AutoencoderKLFlux2, 32 channels),
  text_encoder/ (klein: Qwen3ForCausalLM, Qwen3-4B or -8B; dev: Mistral3ForConditionalGeneration),
  tokenizer/, scheduler/;
- the transformer's original (Black Forest Labs) names and diffusers': q, k and v are one fused
  ``qkv`` Linear in each double block's attention (rows q, k, v), and the final adaLN's rows are
  (shift, scale) there and (scale, shift) in diffusers;
- Black Forest Labs' single files: ``flux-2-klein-4b.safetensors``, ``flux-2-klein-base-4b``,
  ``flux-2-klein-9b``, ``flux-2-klein-base-9b`` (and ``-fp8``), ``flux2-dev.safetensors``;
  Comfy-Org's: ``flux2_dev_fp8mixed.safetensors``, ``qwen_3_4b.safetensors``,
  ``qwen_3_8b_fp8mixed.safetensors``, ``flux2-vae.safetensors``.
"""

from __future__ import annotations

PIPELINES = {"klein": "Flux2KleinPipeline", "dev": "Flux2Pipeline"}
TRANSFORMER_CLASS = "Flux2Transformer2DModel"
VAE_CLASS = "AutoencoderKLFlux2"
TEXT_ENCODER_CLASS = {
    "klein": "transformers:Qwen3ForCausalLM",
    "dev": "transformers:Mistral3ForConditionalGeneration",
}
# The text encoder's hidden states the pipelines stack per token (text_encoder_out_layers).
TEXT_LAYERS = {"klein": (9, 18, 27), "dev": (10, 20, 30)}
MAX_TOKENS = 512  # the pipelines' max_sequence_length
# Reference images sit at T = 10, 20, ... on the first position axis (_prepare_image_ids).
REFERENCE_T_STEP = 10
# The single file's prefix inside a full ComfyUI checkpoint.
CHECKPOINT_PREFIX = "model.diffusion_model."

# The released transformers' configs (their config.json), by model.
RELEASED = {
    "klein-4b": dict(num_layers=5, num_single_layers=20, num_attention_heads=24,
                     joint_attention_dim=7680, guidance_embeds=False),
    "klein-9b": dict(num_layers=8, num_single_layers=24, num_attention_heads=32,
                     joint_attention_dim=12288, guidance_embeds=False),
    "dev": dict(num_layers=8, num_single_layers=48, num_attention_heads=48,
                joint_attention_dim=15360, guidance_embeds=True),
}  # fmt: skip
COMMON = dict(patch_size=1, in_channels=128, out_channels=None, attention_head_dim=128,
              timestep_guidance_channels=256, mlp_ratio=3.0, axes_dims_rope=(32, 32, 32, 32),
              rope_theta=2000, eps=1e-6)  # fmt: skip
# The released text encoders' configs (Qwen3-4B and Qwen3-8B), by model.
_QWEN3 = dict(num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
              vocab_size=151936, rope_theta=1000000, max_position_embeddings=40960,
              rms_norm_eps=1e-6, hidden_act="silu")  # fmt: skip
TEXT_ENCODERS = {
    "klein-4b": dict(_QWEN3, hidden_size=2560, intermediate_size=9728, tie_word_embeddings=True),
    "klein-9b": dict(_QWEN3, hidden_size=4096, intermediate_size=12288, tie_word_embeddings=False),
    # Mistral Small 3.1 24B (Mistral3ForConditionalGeneration: its language model and the
    # Pixtral vision tower, which FLUX.2 leaves unused)
    "dev": dict(
        text_config=dict(
            model_type="mistral",
            hidden_size=5120,
            intermediate_size=32768,
            num_hidden_layers=40,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=131072,
            rope_theta=1e9,
            max_position_embeddings=131072,
        ),
        vision_config=dict(
            model_type="pixtral",
            hidden_size=1024,
            intermediate_size=4096,
            num_hidden_layers=24,
            num_attention_heads=16,
            head_dim=64,
            image_size=1540,
            patch_size=14,
        ),
        spatial_merge_size=2,
    ),  # fmt: skip
}
# The released schedulers: sigmas shifted by exp(mu), mu from the image's token count and the
# step count (the pipelines' compute_empirical_mu).
SCHEDULER_CONFIG = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                        base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                        max_image_seq_len=4096, time_shift_type="exponential")  # fmt: skip

# Original -> diffusers names outside the blocks.
TOP = {
    "img_in": "x_embedder",
    "txt_in": "context_embedder",
    "time_in.in_layer": "time_guidance_embed.timestep_embedder.linear_1",
    "time_in.out_layer": "time_guidance_embed.timestep_embedder.linear_2",
    "guidance_in.in_layer": "time_guidance_embed.guidance_embedder.linear_1",
    "guidance_in.out_layer": "time_guidance_embed.guidance_embedder.linear_2",
    "double_stream_modulation_img.lin": "double_stream_modulation_img.linear",
    "double_stream_modulation_txt.lin": "double_stream_modulation_txt.linear",
    "single_stream_modulation.lin": "single_stream_modulation.linear",
    "final_layer.linear": "proj_out",
    "final_layer.adaLN_modulation.1": "norm_out.linear",  # rows' halves swapped
}
SWAPPED = ("final_layer.adaLN_modulation.1",)
# double_blocks.{i}.<original> -> transformer_blocks.{i}.<diffusers parts, in row order>
DOUBLE = {
    "img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
    "img_attn.norm.query_norm": ("attn.norm_q",),
    "img_attn.norm.key_norm": ("attn.norm_k",),
    "img_attn.proj": ("attn.to_out.0",),
    "img_mlp.0": ("ff.linear_in",),
    "img_mlp.2": ("ff.linear_out",),
    "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
    "txt_attn.norm.query_norm": ("attn.norm_added_q",),
    "txt_attn.norm.key_norm": ("attn.norm_added_k",),
    "txt_attn.proj": ("attn.to_add_out",),
    "txt_mlp.0": ("ff_context.linear_in",),
    "txt_mlp.2": ("ff_context.linear_out",),
}
# single_blocks.{i}.<original> -> single_transformer_blocks.{i}.<diffusers>
SINGLE = {
    "linear1": ("attn.to_qkv_mlp_proj",),
    "linear2": ("attn.to_out",),
    "norm.query_norm": ("attn.norm_q",),
    "norm.key_norm": ("attn.norm_k",),
}
BLOCKS = (("double_blocks", "transformer_blocks", DOUBLE),
          ("single_blocks", "single_transformer_blocks", SINGLE))  # fmt: skip
