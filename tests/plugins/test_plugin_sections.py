"""No setting silently ignored: a misspelt [plugins.<name>] section, an unknown key in a
known one, or a section for a plugin that is not loaded stops `serve` and `tune` with one
line naming it and the closest known names."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tokenops.config import ConfigError, Settings
from tokenops.plugin_sections import check_plugin_sections, known_sections


def _run(tmp_path, toml: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    (tmp_path / "tokenops.toml").write_text(toml)
    return subprocess.run([sys.executable, "-m", "tokenops", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


@pytest.mark.parametrize(("toml", "says"), [
    ("[plugins.semantic_cahce]\nenabled = true\n", "unknown section [plugins.semantic_cahce]; did you mean semantic_cache"),
    ("[plugins.memory]\nenabled = true\n", "unknown section [plugins.memory]; did you mean session_memory"),
    ("[plugins.rate_limit]\nburst = 6\n", "[plugins.rate_limit] has unknown key 'burst'; did you mean burst_s"),
])
def test_serve_stops_with_one_line(tmp_path, toml, says):
    r = _run(tmp_path, toml, "serve", "--no-store", "--port", "1")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], r.stderr


def test_a_section_for_a_plugin_not_loaded_names_it(tmp_path):
    r = _run(tmp_path, "[plugins.semantic_cache]\nenabled = true\n", "serve", "--no-store", "--port", "1",
             env={"TOKENOPS_LOAD_PLUGINS": ""})
    assert r.returncode == 2
    assert "configures plugin 'semantic_cache', which is not loaded" in r.stderr.strip(), r.stderr


def test_tune_that_launches_stops_too(tmp_path):
    r = _run(tmp_path, "[plugins.speculatve]\nmethod = \"ngram\"\n", "tune", "--slo", "p95=1s", "--launch")
    assert r.returncode == 2 and "did you mean speculative" in r.stderr, r.stderr


def test_every_documented_section_is_known_and_shared_sections_union_their_keys():
    sections = known_sections()
    assert {"router", "speculative", "keys", "rate_limit", "load_balance", "semantic_cache"} <= set(sections)
    assert {"threshold", "rules", "semantic", "profile", "use", "alias"} <= sections["router"].keys
    assert len(sections["router"].plugins) == 4
    check_plugin_sections(Settings().plugins)  # nothing configured: nothing to refuse
    with pytest.raises(ConfigError, match="must be a table"):
        check_plugin_sections({"cascade": 3})
