"""The serve tests' config helpers write the TOML the tests mean (tomllib reads it back)."""

import tomllib
from pathlib import Path

from tests.serve_configs import config, local_model, openai_model, section


def test_models_and_sections_read_back_as_written():
    text = config(
        local_model("tiny", Path("/models/tiny dir"), max_num_seqs=4),
        openai_model("up", urls=["http://a:1", "http://b:2"], max_retries=0, served_model='q"x'),
        section("plugins.quantization", weights="int8", enabled=True, scale=0.5),
        section("gateway", api_keys={"sk-1": "acme"}),
    )
    assert tomllib.loads(text) == {
        "models": [
            {"name": "tiny", "backend": "local", "path": "/models/tiny dir", "max_num_seqs": 4},
            {"name": "up", "backend": "openai", "urls": ["http://a:1", "http://b:2"], "max_retries": 0,
             "served_model": 'q"x'},
        ],
        "plugins": {"quantization": {"weights": "int8", "enabled": True, "scale": 0.5}},
        "gateway": {"api_keys": {"sk-1": "acme"}},
    }
