import pytest

from tokenops.config import ConfigError, load_settings


def test_defaults_without_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = load_settings(environ={})
    assert s.models == [] and s.gateway.host == "127.0.0.1" and s.gateway.port == 8000
    assert s.engine.max_num_seqs == 32 and s.store.path.endswith(".duckdb")


def test_file_and_env_overrides(tmp_path):
    cfg = tmp_path / "tokenops.toml"
    cfg.write_text(
        """
[[models]]
name = "small"
path = "/models/small"
cost_input_per_1m = 0.1
cost_output_per_1m = 0.2

[[models]]
name = "big"
backend = "openai"
url = "http://127.0.0.1:9000/v1"
replicas = 2

[gateway]
port = 9001

[engine]
max_num_seqs = 8

[plugins.blocklist]
words = ["x"]

[slo]
targets = ["p95=200ms", "tpot_p95=50ms"]
"""
    )
    env = {"TOKENOPS_ENGINE__MAX_NUM_BATCHED_TOKENS": "1024", "TOKENOPS_STORE": "/tmp/x.duckdb", "TOKENOPS_GATEWAY__PORT": "9100"}
    s = load_settings(cfg, environ=env)
    assert [m.name for m in s.models] == ["small", "big"]
    assert s.models[1].replicas == 2 and s.models[0].cost_output_per_1m == 0.2
    assert s.gateway.port == 9100  # environment beats the file
    assert s.engine.max_num_seqs == 8 and s.engine.max_num_batched_tokens == 1024
    assert s.store.path == "/tmp/x.duckdb"
    assert [x.label for x in s.slos] == ["ttft_p95=200ms", "tpot_p95=50ms"]
    assert s.plugin_settings("blocklist") == {"words": ["x"]}


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("[gateway]\nprot = 1\n", "unknown key(s) prot"),
        ("[gatway]\n", "unknown section(s) gatway"),
        ("[engine]\nmax_num_seqs = 'many'\n", "expected int"),
        ("[[models]]\nname='a'\nbackend='openai'\n", "needs url"),
        ("[[models]]\nname='a'\n[[models]]\nname='a'\n", "unique"),
        ("[slo]\ntargets=['p95=fast']\n", "[slo]"),
        ("[gateway\n", "invalid TOML"),
    ],
)
def test_bad_config_gives_one_clear_line(tmp_path, text, fragment):
    cfg = tmp_path / "tokenops.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_settings(cfg, environ={})
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_file_and_bad_env(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", environ={})
    with pytest.raises(ConfigError, match="unknown section"):
        load_settings(None, environ={"TOKENOPS_ENGNE__X": "1"})
    with pytest.raises(ConfigError, match="expected int"):
        load_settings(None, environ={"TOKENOPS_GATEWAY__PORT": "eighty"})


def test_env_overrides_of_optional_int_fields_are_coerced():
    s = load_settings(environ={"TOKENOPS_ENGINE__TORCH_THREADS": "1", "TOKENOPS_ENGINE__MAX_MODEL_LEN": "512"})
    assert s.engine.torch_threads == 1 and s.engine.max_model_len == 512
    with pytest.raises(ConfigError, match=r"torch_threads: expected int, got 'x'"):
        load_settings(environ={"TOKENOPS_ENGINE__TORCH_THREADS": "x"})
