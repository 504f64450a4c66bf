"""The typed training config: one pydantic model per TOML section.

Every key name is unique across sections and spelled as in kohya-ss sd-scripts, so a kohya flat
args file (any table names, flattened one level) and our sectioned file load into the same
schema. The loader routes each key to its section by name (see ``field_sections``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from library.config.adapter_schema import (
    LYCORIS_MODULE,
    MAX_RANK,
    AdapterSection,
    adapter_problem,
    lycoris_spec,
)
from library.config.data_schema import DataSection
from library.config.dataset_schema import DatasetConfig
from library.config.expert_schema import ExpertSection
from library.config.flow_schema import FlowSection
from library.config.model_schema import ModelSection
from library.config.optimizer_schema import MAX_RATE, SHARDABLE_OPTIMIZERS, OptimizerSection
from library.config.provenance import Provenance
from library.config.sampling_schema import SamplingSection
from library.config.section import Section
from library.models.families.family_entry import GENERIC_LORA_MODULE
from library.models.families.registry import FAMILIES, listed, network_modules
from library.saving.output_names import EXPERT_TAGS, reserved_ending

# The network_module values: kohya's LoRA, each registered family's own module, LyCORIS.
NetworkModule = Literal[network_modules()]
_FAMILY_MODULES = listed(
    [
        f'"{entry.network_module}" for {entry.label}'
        for entry in FAMILIES
        if entry.network_module != GENERIC_LORA_MODULE
    ]
)


class NetworkSection(Section):
    train_mode: Literal["lora", "unet"] = Field(
        "lora",
        description='"lora" trains a LoRA adapter; "unet" fine-tunes every weight of the '
        "denoiser (the UNet, or FLUX.1's transformer).",
    )
    network_module: NetworkModule = Field(
        GENERIC_LORA_MODULE,
        description=f'Adapter type; kohya name. "{GENERIC_LORA_MODULE}" (LoRA/LoCon), '
        f"{_FAMILY_MODULES} (the same LoRA, saved in kohya's names for that family), or "
        f'"{LYCORIS_MODULE}" for LyCORIS\' LoCon, LoHa and LoKr (with DoRA), chosen by algo in '
        "[adapter].",
    )
    network_dim: int = Field(
        4, ge=1, le=MAX_RANK, description="LoRA rank of Linear and 1x1 conv layers."
    )
    network_alpha: float = Field(
        1.0, gt=0, description="LoRA alpha; the adapter output is scaled by alpha / rank."
    )
    conv_dim: int | None = Field(
        None,
        ge=1,
        le=MAX_RANK,
        description="Rank for 3x3 convs of ResNet blocks, down- and upsamplers (LoCon). Unset: no "
        'conv LoRA (with lycoris.kohya: network_dim, as LyCORIS does). Also accepted in '
        'network_args as "conv_dim=N".',
    )
    conv_alpha: float | None = Field(
        None,
        gt=0,
        description="Alpha of the conv LoRA. Unset: 1 (scale 1 / conv_dim), as in kohya; with "
        "lycoris.kohya: network_alpha, as LyCORIS does.",
    )
    network_args: list[str] = Field(
        default_factory=list,
        description='kohya-style extra network arguments as "key=value" strings: conv_dim, '
        "conv_alpha, the LoRA+ ratios, the [adapter] keys (LyCORIS' and the block-wise ones) and "
        "the [flow] adapter keys (split_qkv, train_t5xxl, train_blocks).",
    )
    scale_weight_norms: float | None = Field(
        None,
        gt=0,
        description="Max-norm regularisation (kohya's): after each step, an adapter whose update "
        "alpha/rank x up @ down has a Frobenius norm above this is scaled back to it (1.0 is "
        "common). Unset or 0: off. LoRA only.",
    )
    network_weights: str | None = Field(
        None, description="Start from this kohya-format LoRA .safetensors file."
    )
    network_train_unet_only: bool = Field(
        False,
        description="Adapt the denoiser (UNet or transformer) only, no text-encoder LoRA. Families "
        "whose text encoders take no adapters (see each family's page) adapt the transformer "
        "only whatever this says (a written false gets a warning); with the text-encoder outputs "
        "cached, unset means true.",
    )
    network_train_text_encoder_only: bool = Field(
        False, description="Adapt the text encoder only (no UNet LoRA)."
    )
    unet_lr: float | None = Field(
        None, ge=0, le=MAX_RATE, description="Learning rate of UNet parameters. Unset: learning_rate."
    )
    text_encoder_lr: float | list[float] | None = Field(
        None,
        description="Learning rate of text-encoder LoRA parameters. Unset: learning_rate. A "
        "list gives one rate per text encoder in order (SDXL: [CLIP-L, OpenCLIP-bigG]; FLUX.1: "
        "[CLIP-L, T5-XXL]); a shorter list repeats its last rate, as kohya does, and rates "
        "beyond the model's text encoders are not used (sd-scripts ignores them too; a warning "
        "says so when they differ).",
    )

    @field_validator("text_encoder_lr")
    @classmethod
    def _text_encoder_rates(cls, value: float | list[float] | None) -> float | list[float] | None:
        rates = value if isinstance(value, list) else [] if value is None else [value]
        if isinstance(value, list) and not value:
            raise ValueError("expected a number >= 0 or a list of them, got []")
        if any(rate < 0 or rate > MAX_RATE for rate in rates):
            raise ValueError(f"learning rates must be >= 0 and <= {MAX_RATE:g}, got {value}")
        return value

    @model_validator(mode="after")
    def _one_side(self) -> NetworkSection:
        if self.network_train_unet_only and self.network_train_text_encoder_only:
            raise ValueError(
                "network_train_unet_only and network_train_text_encoder_only are both true; "
                "set at most one"
            )
        return self


class TrainingSection(Section):
    train_batch_size: int = Field(
        1,
        ge=1,
        description="Micro-batch size per process (the default of datasets without batch_size).",
    )
    gradient_accumulation_steps: int = Field(
        1, ge=1, description="Micro-batches per optimizer step on each process."
    )
    max_train_steps: int | None = Field(
        None,
        ge=1,
        description="Optimizer steps to train. Unset and no max_train_epochs: 1600 (kohya's default).",
    )
    max_train_epochs: int | None = Field(
        None, ge=1, description="Train this many epochs; overrides max_train_steps."
    )
    mixed_precision: Literal["no", "fp16", "bf16"] = Field(
        "no",
        description="Precision of frozen weights and autocast; trained weights stay float32 "
        "unless full_bf16 / full_fp16 is set.",
    )
    full_bf16: bool = Field(
        False,
        description="Keep the trained weights, their gradients and the optimizer state in "
        "bfloat16 too (needs mixed_precision = \"bf16\"): about half the memory of float32 "
        "weights, at the cost of small updates rounding away; a stochastic-rounding or 8-bit "
        "optimizer softens that.",
    )
    full_fp16: bool = Field(
        False,
        description="Keep the trained weights and gradients in float16 (needs mixed_precision "
        "= \"fp16\"); the loss scaler guards against underflow. Riskier than full_bf16: "
        "float16 overflows above 65504.",
    )
    fp8_base: bool = Field(
        False,
        description="Store the frozen base model's Linear weights (denoiser and text encoders) "
        "in float8 (e4m3), 1 byte instead of 2, and compute with them in the mixed-precision "
        "dtype. For LoRA training; the frozen weights are rounded, so results differ slightly "
        "from a bf16 base.",
    )
    fp8_base_unet: bool = Field(
        False,
        description="fp8_base for the denoiser only (the UNet or transformer); the text "
        "encoders keep the weight dtype.",
    )
    base_model_precision: Literal["no_change", "nf4-bnb", "int8-bnb"] = Field(
        "no_change",
        description="Store the frozen denoiser's Linear weights quantized by bitsandbytes "
        "(SimpleTuner's key): nf4-bnb (QLoRA's 4-bit NormalFloat, about 0.56 bytes per weight) "
        "or int8-bnb (8-bit per-row absmax, about 1 byte); each use dequantizes into the "
        "mixed-precision dtype. For LoRA and LyCORIS training; the adapters stay in their own "
        "dtype and their files load on the full-precision base. fp8_base then stores the text "
        "encoders in float8.",
    )
    bnb_4bit_use_double_quant: bool = Field(
        False,
        description="With base_model_precision = \"nf4-bnb\": quantize the per-block scales "
        "too (QLoRA's double quantization; transformers' BitsAndBytesConfig word), about "
        "0.52 bytes per weight instead of 0.56.",
    )
    gradient_checkpointing: bool = Field(False, description="Trade compute for activation memory.")
    cpu_offload_checkpointing: bool = Field(
        False,
        description="With gradient_checkpointing: keep each checkpointed block's inputs in host "
        "memory until the backward pass needs them, instead of on the GPU (kohya's key). Less "
        "GPU memory, two host transfers per block and step; the same gradients.",
    )
    blocks_to_swap: int = Field(
        0,
        ge=0,
        description="FLUX.1 and SD3 LoRA: keep the frozen weights of this many of the "
        "transformer's last blocks in host memory, copied to the GPU only while a layer uses "
        "them (kohya's key and block split). Less GPU memory, one host transfer per swapped "
        "weight per forward and backward pass; the same results.",
    )
    fsdp: Literal["no", "full_shard", "shard_grad_op"] = Field(
        "no",
        description="With several processes, shard the denoiser over them with PyTorch's FSDP2 "
        "instead of copying it to each: its weights (frozen and trained), gradients and "
        'optimizer state are split, each block gathered only while it computes. "full_shard" '
        'frees each block again after its forward pass (least memory); "shard_grad_op" keeps it '
        "gathered until its backward pass (less communication). kohya's deepspeed + zero_stage "
        "map onto it. The same results as without.",
    )
    fsdp_text_encoder: bool = Field(
        False,
        description="With several processes, shard each frozen text encoder over them with "
        "FSDP2 while it fills the text-encoder cache (each decoder layer gathered only while "
        "it computes; every process encodes its own share of the captions), then free it: a "
        "text encoder too large for one device (a 24B language model) is held 1/N per "
        "device. Needs cache_text_encoder_outputs, fixed captions and frozen text encoders "
        "(nothing may encode after the cache is filled); the sample prompts are encoded "
        "during the fill. Independent of fsdp. The same cache as without.",
    )
    ignore_memory_estimate: bool = Field(
        False,
        description="Train even when the estimated peak memory (printed in the plan) exceeds "
        "the device's total memory, or when the estimate's forward pass fails on the run's "
        "shapes; otherwise such a run (and its dry run) stops before training.",
    )
    sdpa: bool = Field(
        True,
        description="Use torch scaled-dot-product attention (the default): PyTorch picks a "
        "flash or memory-efficient kernel where the device has one. false: plain attention "
        "(unless xformers or mem_eff_attn is true).",
    )
    xformers: bool = Field(
        False,
        description="kohya's xformers switch. Accepted for compatibility: scaled-dot-product "
        "attention serves it (its memory-efficient kernel is xformers' algorithm); the trained "
        "result is the same attention either way.",
    )
    mem_eff_attn: bool = Field(
        False,
        description="kohya's memory-efficient attention switch; served by scaled-dot-product "
        "attention like xformers.",
    )
    seed: int = Field(42, ge=0, description="Seed of the data order, noise and timesteps.")
    noise_offset: float = Field(0.0, ge=0, description="Add offset noise of this strength.")
    min_snr_gamma: float | None = Field(
        None, gt=0, description="Min-SNR loss weighting gamma (5 is common). Unset: off."
    )
    noise_offset_random_strength: bool = Field(
        False, description="Scale each sample's noise offset by a uniform draw in [0, 1)."
    )
    adaptive_noise_scale: float = Field(
        0.0,
        description="Add this times the absolute mean of each latent channel to noise_offset "
        "(clamped at 0). Needs noise_offset. 0: off.",
    )
    multires_noise_iterations: int = Field(
        0,
        ge=0,
        description="Multi-resolution (pyramid) noise: add this many octaves of upsampled noise "
        "(6-10 is common). 0: off.",
    )
    multires_noise_discount: float = Field(
        0.3, ge=0, le=1, description="Weight of octave i is discount ** i (multires noise)."
    )
    ip_noise_gamma: float = Field(
        0.0,
        ge=0,
        description="Input perturbation: the model input gets noise + gamma * extra noise; the "
        "target keeps the plain noise (0.1 is common). 0: off.",
    )
    ip_noise_gamma_random_strength: bool = Field(
        False, description="Scale each sample's ip_noise_gamma by a uniform draw in [0, 1)."
    )
    min_timestep: int = Field(0, ge=0, description="Smallest training timestep (inclusive).")
    max_timestep: int | None = Field(
        None,
        ge=1,
        description="Timesteps are drawn below this (exclusive); equal to min_timestep: always "
        "that timestep. Unset: the model's number of timesteps (1000).",
    )
    preserve_distribution_shape: bool = Field(
        False,
        description="Where a flow model's draw takes min_timestep / max_timestep: draw each "
        "sample's noise level again until it lies in that range (both ends in), so the levels "
        "keep the shape of the run's draw (musubi-tuner's word), instead of scaling the draw "
        "into the range. A DDPM model's uniform draw in the range is that already.",
    )
    loss_type: Literal["l2", "l1", "huber", "smooth_l1"] = Field(
        "l2",
        description="l2 (squared error), l1 (absolute error), huber (2c(sqrt(d^2+c^2)-c)) or "
        "smooth_l1 (2(sqrt(d^2+c^2)-c)), d the prediction error and c the Huber threshold.",
    )
    huber_schedule: Literal["constant", "exponential", "snr"] = Field(
        "snr",
        description="Huber threshold per timestep t of T: constant c*scale; exponential "
        "scale*c^(t/T); snr (1-c)/(1+sigma_t)^2 + c, sigma_t = sqrt((1-abar_t)/abar_t).",
    )
    huber_c: float = Field(
        0.1, gt=0, description="Huber threshold c of loss_type huber and smooth_l1."
    )
    huber_scale: float = Field(
        1.0, gt=0, description="Multiplies the constant and exponential Huber thresholds."
    )
    debiased_estimation_loss: bool = Field(
        False,
        description="Weight each sample's loss by 1/sqrt(SNR) (epsilon) or 1/(SNR+1) (v); SNR "
        "capped at 1000.",
    )
    scale_v_pred_loss_like_noise_pred: bool = Field(
        False,
        description="v-prediction models only: weight the loss by SNR/(SNR+1) so it is scaled "
        "like an epsilon loss; SNR capped at 1000.",
    )
    v_pred_like_loss: float = Field(
        0.0,
        ge=0,
        description="Epsilon models only: add this times the loss divided by SNR/(SNR+1) (a "
        "v-prediction-like term). 0: off.",
    )

    @model_validator(mode="after")
    def _noise_needs(self) -> TrainingSection:
        needs = {
            "adaptive_noise_scale": "noise_offset",
            "noise_offset_random_strength": "noise_offset",
            "ip_noise_gamma_random_strength": "ip_noise_gamma",
        }
        for key, base in needs.items():
            if getattr(self, key) and not getattr(self, base):
                raise ValueError(f"{key} only acts together with {base}; set {base} > 0")
        if self.max_timestep is not None and self.min_timestep > self.max_timestep:
            raise ValueError(
                f"min_timestep = {self.min_timestep} is above max_timestep = {self.max_timestep}"
            )
        return self

    prior_loss_weight: float = Field(1.0, ge=0, description="Loss weight of regularisation images.")
    max_data_loader_n_workers: int = Field(
        0,
        ge=0,
        description="Data-loader worker processes (0 loads in the training process). They "
        "start once per run and load across epoch boundaries.",
    )
    persistent_data_loader_workers: bool = Field(
        False,
        description="kohya's switch to keep data-loader workers alive between epochs; "
        "difftune's workers always live for the whole run (one loader per run), so either "
        "value trains the same, as fast.",
    )
    ddp_timeout: int | None = Field(
        None,
        ge=1,
        description="Minutes a process waits for the others at a collective before failing "
        "(several processes only). Unset: 30.",
    )
    ddp_gradient_as_bucket_view: bool = Field(
        False,
        description="Let gradients share memory with DistributedDataParallel's communication "
        "buckets (saves one gradient copy).",
    )
    ddp_static_graph: bool = Field(
        False,
        description="Tell DistributedDataParallel the set of used parameters never changes "
        "(lets it skip per-step bookkeeping).",
    )
    ema_decay: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="Keep an exponential moving average of the trained weights with this decay "
        "(e.g. 0.999) and save it beside every output as <name>-ema.safetensors. Unset: no EMA.",
    )
    nan_policy: Literal["stop", "skip"] = Field(
        "stop",
        description='A non-finite loss: "stop" saves the state before that step and stops with '
        'the step named; "skip" drops that optimizer step, counts it and goes on.',
    )

    @model_validator(mode="after")
    def _full_half_needs_its_precision(self) -> TrainingSection:
        for key, precision in (("full_bf16", "bf16"), ("full_fp16", "fp16")):
            if getattr(self, key) and self.mixed_precision != precision:
                raise ValueError(
                    f'{key} = true needs mixed_precision = "{precision}", not '
                    f'"{self.mixed_precision}"'
                )
        return self

    @model_validator(mode="after")
    def _static_graph_needs_no_accumulation(self) -> TrainingSection:
        # PyTorch's DDP reducer fails under no_sync() with a static graph (pytorch#143580)
        if self.ddp_static_graph and self.gradient_accumulation_steps > 1:
            raise ValueError(
                "ddp_static_graph = true does not work with gradient_accumulation_steps > 1 "
                "(a PyTorch limitation); set one of them back"
            )
        return self

    @model_validator(mode="after")
    def _quantized_base_options(self) -> TrainingSection:
        if self.bnb_4bit_use_double_quant and self.base_model_precision != "nf4-bnb":
            raise ValueError(
                "bnb_4bit_use_double_quant = true only acts with base_model_precision = "
                '"nf4-bnb"; set that or remove it'
            )
        if self.base_model_precision != "no_change" and self.fp8_base_unet:
            raise ValueError(
                f'base_model_precision = "{self.base_model_precision}" and fp8_base_unet both '
                "store the denoiser's frozen weights; keep one (fp8_base with a quantized base "
                "stores the text encoders in float8)"
            )
        return self

    @model_validator(mode="after")
    def _offload_needs_checkpointing(self) -> TrainingSection:
        if self.cpu_offload_checkpointing and not self.gradient_checkpointing:
            raise ValueError(
                "cpu_offload_checkpointing = true offloads what gradient checkpointing keeps: "
                "set gradient_checkpointing = true too"
            )
        return self


class SavingSection(Section):
    output_dir: str = Field("output", description="Folder for saved networks, models and states.")
    output_name: str = Field(
        "last",
        description="Base name of the saved files. It may not end like another name's outputs "
        "(-ema, -state, -stepNNNNNNNN, -NNNNNN, .safetensors, -summary.json, .lock): two runs "
        "could then write the same files.",
    )
    save_model_as: Literal["safetensors"] = Field(
        "safetensors", description="File format of saved weights."
    )
    save_precision: Literal["float", "fp16", "bf16"] = Field(
        "float", description="dtype of saved weights."
    )
    lora_format: Literal["kohya", "diffusers"] = Field(
        "kohya",
        description='Key layout of saved LoRA files: "kohya" (lora_unet_..., lora_down/lora_up '
        'and alpha; what sd-scripts writes, and ComfyUI, A1111/Forge and diffusers load), or '
        '"diffusers" (transformer.<module>.lora_A/lora_B with the scale folded in), for SD3, '
        "whose kohya files diffusers' loader does not read. network_weights reads either.",
    )
    save_every_n_steps: int | None = Field(None, ge=1, description="Save every N optimizer steps.")
    save_every_n_epochs: int | None = Field(None, ge=1, description="Save every N epochs.")
    save_last_n_steps: int | None = Field(
        None,
        ge=1,
        description="Keep only the step saves of the last N optimizer steps: each new one "
        "deletes those older than N steps (their states too, unless save_last_n_steps_state is "
        "set).",
    )
    save_last_n_steps_state: int | None = Field(
        None,
        ge=1,
        description="With save_state: keep only the step states of the last N optimizer steps, "
        "instead of save_last_n_steps' N (the weights files keep following save_last_n_steps). "
        "The state a resume started from stays until a newer state is written.",
    )
    save_last_n_epochs: int | None = Field(
        None,
        ge=1,
        description="Keep only the last N epoch saves (their states too, unless "
        "save_last_n_epochs_state is set).",
    )
    save_last_n_epochs_state: int | None = Field(
        None,
        ge=1,
        description="With save_state: keep only the last N epoch states, instead of "
        "save_last_n_epochs' N (the weights files keep following save_last_n_epochs).",
    )
    save_state: bool = Field(
        False, description="Also save the resumable training state with every save."
    )
    save_state_on_train_end: bool = Field(
        False, description="Save the resumable training state when training ends."
    )
    resume: str | None = Field(None, description="A saved state folder to continue from.")
    overwrite: bool = Field(
        False,
        description="Allow replacing an earlier run's outputs of this output_name (otherwise "
        "refused): a new run first moves them, with that run's summary and sample images, to a "
        "folder <output_name>-replaced-<date>_<time> in output_dir. Never an input of the run: "
        "a run that would write over its model, VAE, network_weights, resume state, images or "
        "other inputs is refused either way.",
    )
    no_metadata: bool = Field(False, description="Write no training metadata into saved files.")
    training_comment: str | None = Field(None, description="Stored as ss_training_comment.")
    metadata_title: str | None = Field(None, description="modelspec.title (default: output_name).")
    metadata_author: str | None = Field(None, description="modelspec.author.")
    metadata_description: str | None = Field(None, description="modelspec.description.")
    metadata_license: str | None = Field(None, description="modelspec.license.")
    metadata_tags: str | None = Field(None, description="modelspec.tags (comma separated).")
    metadata_usage_hint: str | None = Field(None, description="modelspec.usage_hint.")
    metadata_trigger_phrase: str | None = Field(None, description="modelspec.trigger_phrase.")
    metadata_thumbnail: str | None = Field(
        None, description="modelspec.thumbnail (a data: URL of a small image, as written)."
    )
    metadata_merged_from: str | None = Field(None, description="modelspec.merged_from.")
    metadata_preprocessor: str | None = Field(None, description="modelspec.preprocessor.")
    metadata_is_negative_embedding: str | None = Field(
        None, description="modelspec.is_negative_embedding."
    )

    @field_validator("output_name")
    @classmethod
    def _name_of_its_own(cls, value: str) -> str:
        ending = reserved_ending(value)
        if ending == ".safetensors":
            raise ValueError(
                f'leave ".safetensors" out of "{value}": it is added to the name of every file'
            )
        if ending is not None:
            base = value[: -len(ending)]
            raise ValueError(
                f'"{value}" ends in "{ending}", like the files output_name "{base}" writes, so '
                f'two runs could replace each other\'s files; choose a name that does not end in '
                f'"{ending}" (e.g. "{base}{_renamed(ending)}")'
            )
        return value


def _renamed(ending: str) -> str:
    """An ending like ``ending`` that no output name reserves."""
    if ending in EXPERT_TAGS:  # an expert's file: "_high_noise" -> "-high-noise"
        return ending.replace("_", "-")
    return f"_{ending.strip('-.')}"


class LoggingSection(Section):
    log_with: Literal["tensorboard", "wandb", "all"] | None = Field(
        None,
        description='Experiment tracker: "tensorboard", "wandb" (Weights & Biases; run `wandb '
        'login` first, or set WANDB_MODE=offline) or "all". Unset: progress bar only.',
    )
    logging_dir: str = Field("logs", description="Folder for tracker files.")
    log_prefix: str | None = Field(None, description="Prefix of the run folder name.")
    log_tracker_name: str | None = Field(
        None, description="Tracker project name (default: output_name)."
    )
    wandb_run_name: str | None = Field(
        None, description="Name of the run in Weights & Biases. Unset: the run folder name."
    )
    log_config: bool = Field(
        True,
        description="Give the tracker the resolved config (secrets such as wandb_api_key left "
        "out) as the run's hyper-parameters. kohya's default is false.",
    )
    wandb_api_key: str | None = Field(
        None,
        description="Weights & Biases API key, used when WANDB_API_KEY is not set. Never "
        "printed, logged or saved; `wandb login` keeps it out of config files altogether.",
    )


class Config(BaseModel):
    """The whole resolved config. Immutable once built."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    model: ModelSection
    network: NetworkSection = NetworkSection()
    optimizer: OptimizerSection = OptimizerSection()
    training: TrainingSection = TrainingSection()
    data: DataSection = DataSection()
    saving: SavingSection = SavingSection()
    logging: LoggingSection = LoggingSection()
    sampling: SamplingSection = SamplingSection()
    flow: FlowSection = FlowSection()
    adapter: AdapterSection = AdapterSection()
    experts: ExpertSection = ExpertSection()
    datasets: list[DatasetConfig] = Field(default_factory=list)
    # Dataset keys written as plain keys (kohya's arguments), as given: already applied to the
    # datasets; kept so --print_config writes them back when the datasets come from elsewhere.
    dataset_defaults: dict = Field(default_factory=dict)
    # Warnings about the files as read (e.g. keys only a GUI writes, ignored), shown at start.
    notices: tuple[str, ...] = ()
    # Where each value came from (library/config/provenance.py): set by the loader, never
    # dumped, and equal for any two configs.
    _provenance: Provenance = PrivateAttr(default_factory=Provenance)

    @model_validator(mode="after")
    def _mode_options(self) -> Config:
        if self.network.train_mode == "unet" and self.network.scale_weight_norms:
            raise ValueError(
                'scale_weight_norms limits LoRA updates; with train_mode = "unet" remove it'
            )
        if self.network.train_mode == "unet" and self.network.network_weights:
            raise ValueError(
                'network_weights starts a LoRA; with train_mode = "unet" remove it '
                '(or use train_mode = "lora")'
            )
        self._check_full_fine_tune()
        problem = adapter_problem(self.adapter, self.network.network_module)
        if problem:
            raise ValueError(problem)
        if self.network.network_module == LYCORIS_MODULE and self.network.train_mode == "unet":
            raise ValueError(
                'network_module = "lycoris.kohya" trains an adapter; with train_mode = "unet" '
                "remove it"
            )
        if self.network.network_module == LYCORIS_MODULE:
            lycoris_spec(self)  # LyCORIS' own rules for its network_args (e.g. factor)
        self._check_data_options()
        self._check_block_swap()
        self._check_sharding()
        return self

    def _check_full_fine_tune(self) -> None:
        """Settings a full fine-tune has nothing to apply to, refused with the config, before
        any weight is read: frozen denoiser weights stored quantized or in float8 (every
        denoiser weight trains), LoRA+'s ratios (no up/down weights)."""
        if self.network.train_mode != "unet":
            return
        for key in ("loraplus_lr_ratio", "loraplus_unet_lr_ratio", "loraplus_text_encoder_lr_ratio"):
            if getattr(self.optimizer, key) is not None:
                raise ValueError(
                    f'{key} is for LoRA up/down weights; with train_mode = "unet" remove it'
                )
        training = self.training
        if training.base_model_precision != "no_change":
            raise ValueError(
                f'base_model_precision = "{training.base_model_precision}" stores frozen weights '
                'quantized; with train_mode = "unet" every denoiser weight trains, so remove it'
            )
        for key in ("fp8_base", "fp8_base_unet"):
            if getattr(training, key):
                raise ValueError(
                    f'{key} stores frozen weights in float8; with train_mode = "unet" every '
                    f"denoiser weight trains, so remove {key}"
                )

    def _check_sharding(self) -> None:
        training = self.training
        if training.fsdp == "no":
            return
        mode = f'fsdp = "{training.fsdp}"'
        if training.mixed_precision == "fp16":
            # each process sees only its shard of the gradients, so torch's loss scaler could
            # skip a step on one process and apply it on another
            raise ValueError(
                f'{mode} does not work with mixed_precision = "fp16" yet (the loss scaler would '
                'decide per shard): use mixed_precision = "bf16"'
            )
        for key in ("fp8_base", "fp8_base_unet"):
            if getattr(training, key):
                raise ValueError(
                    f"{mode} does not work with {key} yet (float8 weights are not gathered): "
                    f"remove {key} or set fsdp = \"no\""
                )
        if training.base_model_precision != "no_change":
            raise ValueError(
                f'{mode} does not work with base_model_precision = '
                f'"{training.base_model_precision}" (quantized weights cannot be sharded): remove '
                'base_model_precision or set fsdp = "no"'
            )
        optimizer = self.optimizer.optimizer_type
        if optimizer not in SHARDABLE_OPTIMIZERS:
            raise ValueError(
                f'{mode} does not work with optimizer_type = "{optimizer}" yet (it needs whole '
                f"tensors); use one of {', '.join(SHARDABLE_OPTIMIZERS)}"
            )
        if training.blocks_to_swap:
            raise ValueError(
                f"{mode} and blocks_to_swap = {training.blocks_to_swap} both keep weights off "
                "the device; use one of them"
            )

    def _check_block_swap(self) -> None:
        count, net = self.training.blocks_to_swap, self.network
        if count and net.train_mode == "unet":
            raise ValueError(
                f"blocks_to_swap = {count} keeps frozen weights in host memory, and with "
                'train_mode = "unet" every weight trains: use it with a LoRA'
            )
        if count and net.network_module == LYCORIS_MODULE:
            raise ValueError(
                f"blocks_to_swap = {count} does not work with LyCORIS adapters yet (they read "
                "the base weights): use networks.lora_flux / networks.lora_sd3, or set "
                "blocks_to_swap = 0"
            )

    def _check_data_options(self) -> None:
        data, net = self.data, self.network
        trains_text = net.train_mode == "lora" and not net.network_train_unet_only
        if data.text_cached and trains_text:
            raise ValueError(
                "cache_text_encoder_outputs needs frozen text encoders: set "
                "network_train_unet_only = true (or turn the cache off)"
            )
        for d, dataset in enumerate(self.datasets):
            for j, subset in enumerate(dataset.subsets):
                augment = [k for k in ("color_aug", "random_crop") if getattr(subset, k)]
                if data.latents_cached and augment:
                    raise ValueError(
                        f"{augment[0]} (datasets[{d}].subsets[{j}]) changes the image every "
                        "epoch, so its latents cannot be cached: turn off cache_latents or "
                        f"{augment[0]}"
                    )
        cadence = [
            k for k in ("validate_every_n_steps", "validate_every_n_epochs") if getattr(data, k)
        ]
        if cadence and not any(dataset.held_out for dataset in self.datasets):
            raise ValueError(f"{cadence[0]} needs validation_split > 0 in a dataset")


# Keys whose values are never printed, logged to a tracker or written into a file.
SECRET_KEYS = frozenset({"wandb_api_key"})

SECTIONS: dict[str, type[Section]] = {
    "model": ModelSection,
    "network": NetworkSection,
    "optimizer": OptimizerSection,
    "training": TrainingSection,
    "data": DataSection,
    "saving": SavingSection,
    "logging": LoggingSection,
    "sampling": SamplingSection,
    "flow": FlowSection,
    "adapter": AdapterSection,
    "experts": ExpertSection,
}


def field_sections() -> dict[str, str]:
    """Map every flat key name to the section that owns it."""
    owner: dict[str, str] = {}
    for section, model in SECTIONS.items():
        for name in model.model_fields:
            assert name not in owner, f"key {name} defined in two sections"
            owner[name] = section
    return owner
