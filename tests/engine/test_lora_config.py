"""``[[models]] lora`` / ``max_loras`` in tokenops.toml and ``serve --lora``: each adapter becomes a model
whose replicas run on the base's replicas."""

from __future__ import annotations

import pytest

from tokenops.backends.lora import LoraBackend
from tokenops.backends.registry import build_replicas
from tokenops.config import ConfigError, load_settings
from tokenops.gateway.server import attach_lora_args


def _settings(tmp_path, text: str):
    cfg = tmp_path / "tokenops.toml"
    cfg.write_text(text)
    return load_settings(str(cfg))


def test_toml_lora_table_builds_adapter_models(tmp_path, tiny_llama_dir):
    settings = _settings(tmp_path, f'[[models]]\nname = "tiny"\npath = "{tiny_llama_dir}"\nreplicas = 2\n'
                                   f'max_loras = 1\nlora = {{ alpha = "/a", beta = "/b" }}\n')
    replicas = build_replicas(settings)
    assert list(replicas) == ["tiny", "alpha", "beta"]
    alpha = replicas["alpha"]
    assert [r.name for r in alpha] == ["alpha#0", "alpha#1"]
    assert all(isinstance(r.backend, LoraBackend) and r.backend.parent == "tiny" for r in alpha)
    assert [r.backend.base for r in alpha] == [r.backend for r in replicas["tiny"]]
    assert alpha[0].backend.pool is replicas["beta"][0].backend.pool and alpha[0].backend.pool.max_loaded == 1


@pytest.mark.parametrize("extra, needle", [
    ('backend = "openai"\nurl = "http://x"\nlora = { a = "/a" }', "backend 'local'"),
    ('lora = { tiny = "/a" }', "base model's name"),
    ('lora = { a = 3 }', "lora must be a table"),
    ("max_loras = -1", "max_loras"),
])
def test_bad_lora_config(tmp_path, extra, needle):
    with pytest.raises(ConfigError, match=needle):
        _settings(tmp_path, f'[[models]]\nname = "tiny"\n{extra}\n')


def test_lora_flag_attaches_to_first_local_model(tmp_path, tiny_llama_dir):
    settings = _settings(tmp_path, f'[[models]]\nname = "tiny"\npath = "{tiny_llama_dir}"\n')
    attach_lora_args(settings, ["alpha=/a"])
    assert settings.models[0].lora == {"alpha": "/a"}
    with pytest.raises(ConfigError, match="NAME=FOLDER"):
        attach_lora_args(settings, ["alpha"])
    # an adapter named like another model is refused
    other = _settings(tmp_path, f'[[models]]\nname = "a"\npath = "{tiny_llama_dir}"\n'
                                f'[[models]]\nname = "b"\npath = "{tiny_llama_dir}"\nlora = {{ a = "/x" }}\n')
    with pytest.raises(ConfigError, match="another model"):
        build_replicas(other)
