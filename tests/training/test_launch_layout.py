"""A multi-process launch that accelerate set up as single processes stops with the fix."""

import pytest


def test_a_multi_process_launch_without_a_process_group_is_refused(monkeypatch):
    from library.errors import ConfigError
    from library.training.preflight import check_launch_layout

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="set ACCELERATE_USE_CPU=true"):
        check_launch_layout(1)
    check_launch_layout(2)  # the process group is there
    monkeypatch.delenv("WORLD_SIZE")
    check_launch_layout(1)  # a plain one-process run


@pytest.mark.parametrize("kind", ["FSDP", "DEEPSPEED"])
def test_accelerate_set_up_to_shard_by_itself_is_refused(kind):
    """accelerate's own FSDP or DeepSpeed would wrap the models behind difftune's back."""
    from accelerate.utils import DistributedType

    from library.errors import ConfigError
    from library.training.preflight import check_launch_layout

    with pytest.raises(ConfigError, match=f'configured for {kind}.*set fsdp = "full_shard"'):
        check_launch_layout(2, DistributedType[kind])
    check_launch_layout(2, DistributedType.MULTI_GPU)
