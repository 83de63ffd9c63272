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
            command = name.removesuffix("_cmd")
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
