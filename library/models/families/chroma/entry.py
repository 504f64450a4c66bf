"""Chroma's entry in the family registry: what shared code asks of it before loading it.

Readable without torch or diffusers: the loader and the family class are named and imported on
first use."""

from __future__ import annotations

from library.models.families.family_entry import Deferred, FamilyEntry, KohyaVocabulary, ToolFacts
from library.models.families.transformer_entry import DIT_OPTIONS

_LINE = "Chroma"
_PACKAGE = "library.models.families.chroma"
# The [flow] keys Chroma reads: the T5-XXL and AE files and T5's tokenizer, T5's caption
# settings, kohya's split_qkv, and the flow-matching draw and loss (FLUX.1's objective).
FLOW_KEYS = frozenset(
    {
        "t5xxl",
        "t5_tokenizer_path",
        "t5xxl_max_token_length",
        "apply_t5_attn_mask",
        "ae",
        "split_qkv",
        "timestep_sampling",
        "sigmoid_scale",
        "discrete_flow_shift",
        "model_prediction_type",
        "weighting_scheme",
        "logit_mean",
        "logit_std",
        "mode_scale",
        "model_type",  # kohya's switch of its FLUX.1 trainer to Chroma: "chroma"
    }
)

CHROMA = FamilyEntry(
    name="chroma",
    label="Chroma",
    models=_LINE,
    lines=(_LINE,),
    family=Deferred(f"{_PACKAGE}.family:ChromaFamily").get,
    claims=Deferred(f"{_PACKAGE}.spec:claims_chroma"),
    load=Deferred(f"{_PACKAGE}.family:load_chroma"),
    # kohya trains Chroma with its FLUX.1 network (flux_train_network.py, model_type chroma)
    network_module="networks.lora_flux",
    flow_matching=True,
    # no key of its own: the T5 keys are the CLIP/T5 families' (transformer_keys.py), the AE
    # file FLUX.1's (flux/config_keys.py)
    flow_keys=FLOW_KEYS,
    kohya=KohyaVocabulary(options=DIT_OPTIONS, network_args=("split_qkv",)),
    tool=ToolFacts(
        component_options={
            "t5xxl": "the T5-XXL encoder file",
            "t5_tokenizer_path": "a folder with the T5 tokenizer (tokenizer.json)",
            "ae": "the autoencoder file of a transformer file (ae.safetensors)",
        },
        variant_labels={"chroma": _LINE},
        to_original=Deferred(f"{_PACKAGE}.original_keys:transformer_to_original"),
        version_marks=(("chroma", _LINE),),
    ),
)
