"""The typed training config: one pydantic model per TOML section.

Every key name is unique across sections and spelled as in kohya-ss sd-scripts, so a kohya flat
args file (any table names, flattened one level) and our sectioned file load into the same
schema. The loader routes each key to its section by name (see ``field_sections``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from library.config.dataset_schema import DatasetConfig


class Section(BaseModel):
    """Base for every section: unknown keys are errors, values keep their TOML types, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, validate_default=True)


class ModelSection(Section):
    pretrained_model_name_or_path: str = Field(
        description="Local folder of a diffusers-format SD 1.x/2.x model (model_index.json, unet/, "
        "vae/, text_encoder/, tokenizer/, scheduler/). Nothing is downloaded."
    )
    v2: bool | None = Field(
        None,
        description="The model is SD 2.x. Unset: detected from the model (cross-attention width 1024).",
    )
    v_parameterization: bool | None = Field(
        None,
        description="Train with the v-prediction target (SD 2.x 768-v). Unset: taken from the "
        "model's scheduler config (prediction_type).",
    )


class NetworkSection(Section):
    train_mode: Literal["lora", "unet"] = Field(
        "lora", description='"lora" trains a LoRA adapter; "unet" fine-tunes every UNet weight.'
    )
    network_module: Literal["networks.lora"] = Field(
        "networks.lora", description='Adapter type; kohya name. Only "networks.lora" (LoRA/LoCon).'
    )
    network_dim: int = Field(4, ge=1, description="LoRA rank of Linear and 1x1 conv layers.")
    network_alpha: float = Field(
        1.0, gt=0, description="LoRA alpha; the adapter output is scaled by alpha / rank."
    )
    conv_dim: int | None = Field(
        None,
        ge=1,
        description="Rank for 3x3 convs of ResNet blocks, down- and upsamplers (LoCon). Unset: no "
        "conv LoRA. Also accepted in network_args as \"conv_dim=N\".",
    )
    conv_alpha: float | None = Field(
        None, gt=0, description="Alpha of the conv LoRA. Unset: same as conv_dim (scale 1)."
    )
    network_args: list[str] = Field(
        default_factory=list,
        description='kohya-style extra network arguments as "key=value" strings. Supported: '
        "conv_dim, conv_alpha.",
    )
    network_weights: str | None = Field(
        None, description="Start from this kohya-format LoRA .safetensors file."
    )
    network_train_unet_only: bool = Field(
        False, description="Adapt the UNet only (no text-encoder LoRA)."
    )
    network_train_text_encoder_only: bool = Field(
        False, description="Adapt the text encoder only (no UNet LoRA)."
    )
    unet_lr: float | None = Field(None, ge=0, description="Learning rate of UNet parameters. Unset: learning_rate.")
    text_encoder_lr: float | None = Field(
        None, ge=0, description="Learning rate of text-encoder LoRA parameters. Unset: learning_rate."
    )

    @model_validator(mode="after")
    def _one_side(self) -> NetworkSection:
        if self.network_train_unet_only and self.network_train_text_encoder_only:
            raise ValueError(
                "network_train_unet_only and network_train_text_encoder_only are both true; "
                "set at most one"
            )
        return self


SchedulerName = Literal[
    "constant",
    "constant_with_warmup",
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
]


class OptimizerSection(Section):
    optimizer_type: Literal["AdamW", "AdamW8bit"] = Field(
        "AdamW", description="Optimizer: AdamW (torch) or AdamW8bit (bitsandbytes). Case-insensitive."
    )
    optimizer_args: list[str] | dict[str, bool | int | float | str | list[float]] = Field(
        default_factory=list,
        description='Extra optimizer arguments: a list of "key=value" strings (kohya) or a table, '
        'e.g. ["weight_decay=0.01", "betas=0.9,0.99"].',
    )
    learning_rate: float = Field(1e-4, ge=0, description="Base learning rate.")
    max_grad_norm: float = Field(
        1.0, ge=0, description="Clip the gradient norm to this value each optimizer step; 0 disables."
    )
    lr_scheduler: SchedulerName = Field("constant", description="Learning-rate schedule.")
    lr_warmup_steps: int | float = Field(
        0,
        ge=0,
        description="Warmup length in optimizer steps; a float below 1 is a ratio of the total steps.",
    )
    lr_scheduler_num_cycles: int = Field(1, ge=1, description="Cycles of cosine_with_restarts.")
    lr_scheduler_power: float = Field(1.0, gt=0, description="Power of the polynomial schedule.")


class TrainingSection(Section):
    train_batch_size: int = Field(
        1, ge=1, description="Micro-batch size per process (the default of datasets without batch_size)."
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
        "no", description="Precision of frozen weights and autocast; trained weights stay float32."
    )
    gradient_checkpointing: bool = Field(False, description="Trade compute for activation memory.")
    sdpa: bool = Field(True, description="Use torch scaled-dot-product attention (the default).")
    seed: int = Field(42, ge=0, description="Seed of the data order, noise and timesteps.")
    noise_offset: float = Field(0.0, ge=0, description="Add offset noise of this strength.")
    min_snr_gamma: float | None = Field(
        None, gt=0, description="Min-SNR loss weighting gamma (5 is common). Unset: off."
    )
    prior_loss_weight: float = Field(
        1.0, ge=0, description="Loss weight of regularisation images."
    )
    max_data_loader_n_workers: int = Field(
        0, ge=0, description="Data-loader worker processes (0 loads in the training process)."
    )
    persistent_data_loader_workers: bool = Field(
        False, description="Keep data-loader workers alive between epochs."
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
    nan_policy: Literal["stop", "skip"] = Field(
        "stop",
        description='A non-finite loss: "stop" saves the state before that step and stops with '
        'the step named; "skip" drops that optimizer step, counts it and goes on.',
    )


class DataSection(Section):
    """kohya's flat dataset arguments; defaults for datasets that do not set them."""

    train_data_dir: str | None = Field(
        None, description='Folder of "<repeats>_<class tokens>" subfolders of training images.'
    )
    reg_data_dir: str | None = Field(
        None, description="Folder of regularisation-image subfolders, same layout."
    )
    dataset_config: str | None = Field(
        None, description="A kohya dataset TOML ([general], [[datasets]], [[datasets.subsets]])."
    )
    resolution: int | list[int] | str = Field(
        512,
        description='Training size: 512, [768, 512] or "768,512" (width, height). Images are '
        "resized to cover it and center-cropped.",
    )
    caption_extension: str = Field(".txt", description="Extension of sidecar caption files.")


class SavingSection(Section):
    output_dir: str = Field("output", description="Folder for saved networks, models and states.")
    output_name: str = Field("last", description="Base name of the saved files.")
    save_model_as: Literal["safetensors"] = Field(
        "safetensors", description="File format of saved weights."
    )
    save_precision: Literal["float", "fp16", "bf16"] = Field(
        "float", description="dtype of saved weights."
    )
    save_every_n_steps: int | None = Field(None, ge=1, description="Save every N optimizer steps.")
    save_every_n_epochs: int | None = Field(None, ge=1, description="Save every N epochs.")
    save_last_n_steps: int | None = Field(
        None, ge=1, description="Delete step saves older than this many steps."
    )
    save_last_n_epochs: int | None = Field(
        None, ge=1, description="Keep only the last N epoch saves."
    )
    save_state: bool = Field(
        False, description="Also save the resumable training state with every save."
    )
    save_state_on_train_end: bool = Field(
        False, description="Save the resumable training state when training ends."
    )
    resume: str | None = Field(None, description="A saved state folder to continue from.")
    overwrite: bool = Field(
        False, description="Allow replacing an existing final output (otherwise refused)."
    )
    no_metadata: bool = Field(False, description="Write no training metadata into saved files.")
    training_comment: str | None = Field(None, description="Stored as ss_training_comment.")
    metadata_title: str | None = Field(None, description="modelspec.title (default: output_name).")
    metadata_author: str | None = Field(None, description="modelspec.author.")
    metadata_description: str | None = Field(None, description="modelspec.description.")
    metadata_license: str | None = Field(None, description="modelspec.license.")
    metadata_tags: str | None = Field(None, description="modelspec.tags (comma separated).")


class LoggingSection(Section):
    log_with: Literal["tensorboard"] | None = Field(
        None, description='Experiment tracker: "tensorboard". Unset: progress bar only.'
    )
    logging_dir: str = Field("logs", description="Folder for tracker files.")
    log_prefix: str | None = Field(None, description="Prefix of the run folder name.")
    log_tracker_name: str | None = Field(None, description="Tracker project name (default: output_name).")


class Config(BaseModel):
    """The whole resolved config. Immutable once built."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    model: ModelSection
    network: NetworkSection = NetworkSection()
    optimizer: OptimizerSection = OptimizerSection()
    training: TrainingSection = TrainingSection()
    data: DataSection = DataSection()
    saving: SavingSection = SavingSection()
    logging: LoggingSection = LoggingSection()
    datasets: list[DatasetConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _mode_options(self) -> Config:
        if self.network.train_mode == "unet" and self.network.network_weights:
            raise ValueError(
                'network_weights starts a LoRA; with train_mode = "unet" remove it '
                '(or use train_mode = "lora")'
            )
        return self


SECTIONS: dict[str, type[Section]] = {
    "model": ModelSection,
    "network": NetworkSection,
    "optimizer": OptimizerSection,
    "training": TrainingSection,
    "data": DataSection,
    "saving": SavingSection,
    "logging": LoggingSection,
}


def field_sections() -> dict[str, str]:
    """Map every flat key name to the section that owns it."""
    owner: dict[str, str] = {}
    for section, model in SECTIONS.items():
        for name in model.model_fields:
            assert name not in owner, f"key {name} defined in two sections"
            owner[name] = section
    return owner
