"""The CLI needs no separate ``click`` package.

typer (0.29) vendors click and ships no dependency on it, while the root group and the
``profile`` group once imported the real ``click`` only to annotate ``resolve_command``
(with the wrong class: typer passes its vendored ``Context``). mypy found it; an environment
without ``click`` (nothing in ``pyproject.toml`` asks for it) could not start ``tokenops``.
"""

import subprocess
import sys

_SCRIPT = """
import sys
sys.modules["click"] = None  # importing click now raises ImportError, as where it is not installed
from typer.testing import CliRunner
from tokenops.cli import build_app
app = build_app()
for args in (["--help"], ["profile", "--help"], ["profile", "not-a-subcommand"]):
    result = CliRunner().invoke(app, args)
    print(args[0], args[-1], result.exit_code, type(result.exception).__name__)
"""


def test_cli_and_plugin_groups_run_without_the_click_package():
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "--help --help 0 NoneType"
    assert lines[1] == "profile --help 0 NoneType"
    # the profile group's own resolve_command ran: the old spelling gets its one-line UserError
    assert lines[2] == "profile not-a-subcommand 1 UserError", out.stdout
