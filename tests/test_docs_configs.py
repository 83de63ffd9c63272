"""Every `tokenops.toml` block in README.md and docs/*.md is a configuration `serve` accepts:
it loads, and each `[plugins.<name>]` section and key is one a loaded plugin reads. (Whether
each block *acts* is checked through a real serve by the tests that read it: docs/configuration.md's
in tests/test_docs_examples.py, the others in the tests named in that page and its neighbours.)"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tokenops.config import load_settings
from tokenops.plugin_sections import check_plugin_sections

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = {"models", "gateway", "engine", "store", "lora", "batches", "shared", "plugins", "slo"}


def _config_blocks() -> list:
    from test_docs_examples import blocks

    out = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for b in blocks(doc):
            if b.language != "toml":
                continue
            data = tomllib.loads(b.code)
            if data and set(data) <= SECTIONS:
                out.append(pytest.param(b, id=b.id))
    return out


@pytest.mark.parametrize("block", _config_blocks())
def test_documented_config_is_accepted(block, tmp_path, register_plugin):
    if "blocklist" in tomllib.loads(block.code).get("plugins", {}):  # the example plugin's own config
        import importlib.util

        source = ROOT / "examples" / "tokenops-blocklist" / "tokenops_blocklist" / "__init__.py"
        spec = importlib.util.spec_from_file_location("docs_configs_blocklist", source)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        register_plugin(module, "blocklist")
    path = tmp_path / "tokenops.toml"
    path.write_text(block.code)
    settings = load_settings(path, environ={})
    check_plugin_sections(settings.plugins, block.id)
