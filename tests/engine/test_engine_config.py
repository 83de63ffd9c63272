"""EngineConfig: validation, defaults consistent with the tunables registry, from_settings."""

import pytest

from tokenops.config import EngineSettings
from tokenops.engine.config import LIVE_TUNABLES, RESTART_TUNABLES, EngineConfig


@pytest.mark.parametrize("kwargs,match", [
    ({"dtype": "int8"}, "dtype"), ({"block_size": 0}, "block_size"), ({"kv_cache_tokens": 8}, "kv_cache_tokens"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"), ({"max_num_seqs": 1.5}, "max_num_seqs"),
    ({"max_model_len": 1}, "max_model_len"), ({"enable_prefix_caching": "yes"}, "enable_prefix_caching"),
    ({"schedule_policy": ""}, "schedule_policy"), ({"torch_threads": -1}, "torch_threads"),
])
def test_invalid_values_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**kwargs)


def test_defaults_match_the_registered_tunables():
    from tokenops.plugins import get_tunables

    registry, config = get_tunables(), EngineConfig()
    for name in LIVE_TUNABLES + RESTART_TUNABLES:
        tunable = registry[f"engine.{name}"]
        assert tunable.live == (name in LIVE_TUNABLES), name
        if name != "torch_threads":  # None here is the tunable's 0 ("torch's default")
            assert getattr(config, name) == tunable.default, name
    assert config.num_kv_blocks == config.kv_cache_tokens // config.block_size


def test_from_settings_copies_and_overrides():
    settings = EngineSettings(block_size=32, kv_cache_tokens=4096, max_num_seqs=7, torch_threads=0)
    config = EngineConfig.from_settings(settings, model="/models/x", model_name="x")
    assert (config.block_size, config.kv_cache_tokens, config.max_num_seqs) == (32, 4096, 7)
    assert config.model == "/models/x" and config.model_name == "x" and config.torch_threads is None
    with pytest.raises(ValueError, match="unknown engine option"):
        EngineConfig.from_settings(settings, nonsense=1)
