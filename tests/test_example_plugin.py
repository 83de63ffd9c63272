"""The example third-party plugin of docs/plugins.md, pip-installed from its own folder,
shows up under its layer in `tokenops plugins` and its hooks are called."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tokenops-blocklist"


@pytest.fixture(scope="module")
def installed(install_example):
    env = dict(os.environ, PYTHONPATH=install_example(EXAMPLE.name))
    env.pop("TOKENOPS_LOAD_PLUGINS", None)
    return env


def test_listed_under_its_layer(installed):
    out = subprocess.run([sys.executable, "-m", "tokenops", "plugins", "--json"], env=installed, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    layers = json.loads(out.stdout)["layers"]
    entry = next(p for p in layers["compute_network"] if p["name"] == "blocklist")
    assert entry["version"] == "0.2.0" and entry["source"] == "entry-point"
    assert "tokenops_admit" in entry["hooks"]
    assert [t["name"] for t in entry["tunables"]] == ["blocklist.words"]


def test_its_hooks_are_called(installed):
    code = """
from tokenops.plugin_manager import hook
from tokenops.types import GatewayRequest
mk = lambda text: GatewayRequest(kind="chat", model="m", body={}, messages=[{"role": "user", "content": text}])
h = hook()
assert h.tokenops_admit(request=mk("hello")) is None
r = h.tokenops_admit(request=mk("this is FORBIDDEN"))
print(r.status, r.code)
h.tokenops_apply_tunables(values={"blocklist.words": "hello"})
print(h.tokenops_admit(request=mk("hello there")).code, h.tokenops_admit(request=mk("forbidden")))
"""
    out = subprocess.run([sys.executable, "-c", code], env=installed, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["400 content_blocked", "content_blocked None"]


def test_the_two_model_config_serves_with_the_plugin(tmp_path):
    """docs/plugins.md's runnable config, as documented: the file loaded with TOKENOPS_PLUGINS."""
    import openai

    from tokenops.testing_serve import ServeProcess

    (tmp_path / "tokenops").symlink_to(EXAMPLE.parents[1] / "tokenops")  # the config's paths are repo-relative
    plugin = EXAMPLE / "tokenops_blocklist" / "__init__.py"
    with ServeProcess(tmp_path, args=["--config", str(EXAMPLE / "tokenops.toml")],
                      env={"TOKENOPS_PLUGINS": str(plugin)}) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)

        def ask(*turns: str):
            messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
            return client.chat.completions.create(model="auto", messages=messages, max_tokens=4, temperature=0)

        assert ask("prove the theorem").model == "large" and ask("say hello").model == "small"
        with pytest.raises(openai.BadRequestError) as refused:
            ask("tell me the secret")  # [plugins.blocklist] words, from the file
        assert refused.value.code == "content_blocked"
        # the last user message decides: a blocked word quoted two turns ago refuses nothing now
        assert ask("tell me the secret", "I cannot.", "then say hello").model == "small"
