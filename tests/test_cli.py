import subprocess
import sys

from typer.testing import CliRunner

from tokenops.cli import COMMAND_MODULES, build_app


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tokenops", *args], capture_output=True, text=True, timeout=120, env=env)


def test_help_lists_command_groups():
    result = CliRunner().invoke(build_app(), ["--help"])
    assert result.exit_code == 0
    assert "plugins" in result.output
    # Every command module that exists registers its command.
    import importlib.util

    for name in COMMAND_MODULES:
        if importlib.util.find_spec(f"tokenops.cli.{name}") is not None:
            command = name.removesuffix("_cmd").replace("_", "-")
            assert command in result.output, f"{command} missing from --help"


def test_version():
    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.startswith("tokenops ")


def test_bad_plugin_file_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from tokenops import hookimpl\n@hookimpl\ndef tokenops_nope(x):\n    pass\n")
    out = run_cli("--plugin", str(bad), "plugins")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "tokenops_nope" in lines[0] and "file:bad" in lines[0]


def test_missing_plugin_file(tmp_path):
    out = run_cli("--plugin", str(tmp_path / "missing.py"), "plugins")
    assert out.returncode == 2 and "does not exist" in out.stderr


def test_technique_commands_come_from_their_plugin():
    import json

    from tokenops.plugin_manager import DEFAULT_PLUGINS, list_plugins

    cli_plugin = next(p for p in list_plugins() if p.name == "multi_model_cli")
    assert cli_plugin.hooks == ["tokenops_register_commands"] and cli_plugin.layer == "multi_model"
    env = {**__import__("os").environ, "TOKENOPS_LOAD_PLUGINS": ""}
    out = run_cli("profile", "run", "m", env=env)
    assert out.returncode == 2 and out.stderr.splitlines() == [
        "error: no command 'profile': plugins add commands too, and TOKENOPS_LOAD_PLUGINS='' loads no plugin beyond the defaults "
        "(`tokenops plugins` shows what is loaded)"]
    only = {**env, "TOKENOPS_LOAD_PLUGINS": "multi_model_cli"}
    layers = json.loads(run_cli("plugins", "--json", env=only).stdout)["layers"]
    assert {p["name"] for plugins in layers.values() for p in plugins} == {"multi_model_cli", *DEFAULT_PLUGINS}
    out = run_cli("route", "--help", env=only)  # the plugin alone brings its commands
    assert out.returncode == 0 and "calibrate" in out.stdout and "train" in out.stdout


ENGINE_PROFILE = """[tune]
model = "tokenops-demo"
hardware = "x86_64-2cpu"

[tunables]
"engine.max_num_seqs" = 6
"""


def test_engine_profile_list_and_show(tmp_path):
    import json

    (tmp_path / "small-batch.toml").write_text(ENGINE_PROFILE)
    result = CliRunner().invoke(build_app(), ["engine-profile", "list", "--dir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == [{"name": "small-batch", "path": str(tmp_path / "small-batch.toml"),
                                          "tunables": {"engine.max_num_seqs": 6},
                                          "tune": {"model": "tokenops-demo", "hardware": "x86_64-2cpu"}}]
    result = CliRunner().invoke(build_app(), ["engine-profile", "show", "small-batch", "--dir", str(tmp_path)])
    assert result.exit_code == 0 and "engine.max_num_seqs = 6" in result.output
    assert "tokenops serve --engine-profile small-batch" in result.output
    result = CliRunner().invoke(build_app(), ["engine-profile", "show", "nope", "--dir", str(tmp_path)])
    assert "no engine profile 'nope'" in str(result.exception)
