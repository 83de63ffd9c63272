"""EngineConfig: validation, defaults consistent with the tunables registry, from_settings."""

import pytest

from tokenops.config import EngineSettings
from tokenops.engine.core.config import EngineConfig, engine_tunables, setting_fields, tunable_names


@pytest.mark.parametrize("kwargs,match", [
    ({"dtype": "int8"}, "dtype"), ({"block_size": 0}, "block_size"), ({"kv_cache_tokens": 8}, "kv_cache_tokens"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"), ({"max_num_seqs": 1.5}, "max_num_seqs"),
    ({"max_model_len": 1}, "max_model_len"), ({"enable_prefix_caching": "yes"}, "enable_prefix_caching"),
    ({"schedule_policy": ""}, "schedule_policy"), ({"torch_threads": -1}, "torch_threads"),
])
def test_invalid_values_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**kwargs)


def test_registered_tunables_are_generated_from_the_fields():
    from tokenops.plugin_manager import get_tunables

    registry, config = get_tunables(), EngineConfig()
    engine_names = {t.name for t in registry if t.name.startswith("engine.")}
    assert engine_names == {f"engine.{n}" for n in tunable_names()}
    assert set(tunable_names("live")) == {"max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching",
                                          "schedule_policy", "priority_classes", "batch_max_share", "batch_step_tokens",
                                          "batch_step_overhead"}
    for name in tunable_names():
        tunable = registry[f"engine.{name}"]
        assert tunable.live == (name in tunable_names("live")), name
        assert tunable.default == (0 if name == "torch_threads" else getattr(config, name)), name
        assert tunable.live or tunable.help.endswith("(restart)."), name
    assert registry["engine.block_size"].choices == (8, 16, 32, 64)
    assert config.num_kv_blocks == config.kv_cache_tokens // config.block_size
    assert [t.name for t in engine_tunables()] == [f"engine.{n}" for n in tunable_names()]


def test_engine_settings_are_generated_from_the_fields():
    settings, config = EngineSettings(), EngineConfig()
    names = [f.name for f in setting_fields()]
    assert set(tunable_names()) <= set(names) and "model" not in names and "speculative" not in names
    for name in names:
        assert getattr(settings, name) == getattr(config, name), name
    assert settings.profile is None and not hasattr(config, "profile")


def test_live_tunables_apply_and_restart_ones_are_refused():
    from types import SimpleNamespace

    from tokenops.engine.core.engine import LLMEngine
    from tokenops.tunables import TunableError

    engine = SimpleNamespace(config=EngineConfig())  # apply_tunables only touches the config
    assert LLMEngine.apply_tunables(engine, {"max_num_seqs": "7", "engine.enable_prefix_caching": "off"}) == {
        "engine.max_num_seqs": 7, "engine.enable_prefix_caching": False}
    assert (engine.config.max_num_seqs, engine.config.enable_prefix_caching) == (7, False)
    with pytest.raises(TunableError, match="engine.block_size needs an engine restart"):
        LLMEngine.apply_tunables(engine, {"block_size": 32})
    with pytest.raises(TunableError, match="unknown engine tunable 'seed'"):
        LLMEngine.apply_tunables(engine, {"seed": 1})
    with pytest.raises(TunableError, match="above the maximum"):
        LLMEngine.apply_tunables(engine, {"max_num_seqs": 5000, "max_num_batched_tokens": 64})
    assert engine.config.max_num_seqs == 7 and engine.config.max_num_batched_tokens == 512  # nothing partial


def test_from_settings_copies_and_overrides():
    settings = EngineSettings(block_size=32, kv_cache_tokens=4096, max_num_seqs=7, torch_threads=0)
    config = EngineConfig.from_settings(settings, model="/models/x", model_name="x")
    assert (config.block_size, config.kv_cache_tokens, config.max_num_seqs) == (32, 4096, 7)
    assert config.model == "/models/x" and config.model_name == "x" and config.torch_threads is None
    with pytest.raises(ValueError, match="unknown engine option"):
        EngineConfig.from_settings(settings, nonsense=1)
