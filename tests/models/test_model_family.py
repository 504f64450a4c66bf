"""Family detection from config flags and the model's own configs, without loading weights."""

from __future__ import annotations

import pytest

from library.config.schema import ModelSection
from library.models.families.sd.family import SD1, SD1_V, SD2, SD2_V, detect_family

SD15_UNET = {"cross_attention_dim": 768, "use_linear_projection": False}
SD21_UNET = {"cross_attention_dim": 1024, "use_linear_projection": True}
EPS = {"prediction_type": "epsilon"}
V = {"prediction_type": "v_prediction"}


def section(**flags) -> ModelSection:
    return ModelSection(pretrained_model_name_or_path="unused", **flags)


@pytest.mark.parametrize(
    ("unet", "sched", "expected"),
    [
        (SD15_UNET, EPS, SD1),
        (SD21_UNET, EPS, SD2),
        (SD21_UNET, V, SD2_V),
        (SD15_UNET, V, SD1_V),
        (SD15_UNET, {}, SD1),  # no prediction_type in the config: diffusers' default, epsilon
        # Non-standard width (tiny models): linear projections mark SD 2.x.
        ({"cross_attention_dim": 32, "use_linear_projection": True}, V, SD2_V),
        ({"cross_attention_dim": 32, "use_linear_projection": False}, EPS, SD1),
        # The width decides over the projection kind for the released widths.
        ({"cross_attention_dim": 1024, "use_linear_projection": False}, EPS, SD2),
    ],
)
def test_detection_from_model_configs(unet, sched, expected):
    assert detect_family(section(), unet, sched) is expected


@pytest.mark.parametrize(
    ("v2", "v_param", "expected"),
    [(False, False, SD1), (True, False, SD2), (True, True, SD2_V), (False, True, SD1_V)],
)
def test_flags_override_detection(v2, v_param, expected):
    # Model configs that say the opposite of the flags in both respects.
    unet = SD15_UNET if v2 else SD21_UNET
    sched = EPS if v_param else V
    assert detect_family(section(v2=v2, v_parameterization=v_param), unet, sched) is expected


def test_one_flag_set_other_detected():
    assert detect_family(section(v2=True), SD15_UNET, V) is SD2_V
    assert detect_family(section(v_parameterization=False), SD21_UNET, V) is SD2


def test_family_fields_match_kohya_metadata():
    expected = {
        SD1: ("sd_v1", "stable-diffusion-v1", 512, "epsilon", "epsilon", False),
        SD2: ("sd_v2", "stable-diffusion-v2-512", 512, "epsilon", "epsilon", True),
        SD2_V: ("sd_v2_v", "stable-diffusion-v2-768-v", 768, "v_prediction", "v", True),
        SD1_V: ("sd_v1_v", "stable-diffusion-v1", 512, "v_prediction", "v", False),
    }
    for family, (base, arch, reso, pred, spec_pred, v2) in expected.items():
        got = (
            family.base_model_version,
            family.modelspec_architecture,
            family.default_resolution,
            family.prediction_type,
            family.modelspec_prediction_type,
            family.v2,
        )
        assert got == (base, arch, reso, pred, spec_pred, v2), family.name
        assert family.lora_architecture == arch + "/lora"
        assert family.v_parameterization == (pred == "v_prediction")
        assert family.text_encoder_lora_prefixes == ("lora_te",)
        assert family.unet_lora_prefix == "lora_unet_"
    assert [f.name for f in (SD1, SD2, SD2_V)] == ["sd1", "sd2", "sd2-v"]


def test_family_is_frozen():
    with pytest.raises(AttributeError):
        SD1.v2 = True  # type: ignore[misc]


def test_denoiser_only_families_train_no_text_encoder_and_grid_is_the_pixel_multiple():
    """The base class's defaults: text encoders get adapters unless DENOISER_ONLY_ADAPTERS says
    otherwise; the bucket grid is the class's PIXEL_MULTIPLE."""
    import dataclasses
    from typing import ClassVar

    from library.models.families.base import ModelFamily

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class DenoiserOnly(type(SD1)):
        PIXEL_MULTIPLE: ClassVar[int] = 32
        DENOISER_ONLY_ADAPTERS: ClassVar[str | None] = "no text-encoder adapters"

    family = DenoiserOnly(**{f.name: getattr(SD1, f.name) for f in dataclasses.fields(SD1)})
    assert SD1.trains_text_encoder(0) and not family.trains_text_encoder(0)
    assert ModelFamily.bucket_grid(family, None) == 32  # SD's own grid reads its UNet


def test_a_derived_family_keeps_every_field_but_its_changes():
    """derived_family gives the subclass every field of the base family (compared one by one
    with dataclasses' own list) except the changed ones, and refuses a class that is not the
    base's subclass."""
    import dataclasses

    from library.models.families.base import derived_family

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Variant(type(SD2_V)):
        pass

    made = derived_family(SD2_V, Variant, name="sd2-variant")
    assert type(made) is Variant and made.name == "sd2-variant"
    for field in dataclasses.fields(SD2_V):
        if field.name != "name":
            assert getattr(made, field.name) == getattr(SD2_V, field.name), field.name
    with pytest.raises(TypeError, match="does not derive"):
        derived_family(made, type(SD2_V))
