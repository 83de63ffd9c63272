"""``--json`` on every command that prints a result (README: all but ``serve`` and ``dashboard``)."""

from __future__ import annotations

import json
from typing import Any

import typer.main
from typer.testing import CliRunner

from tokenops.cli import build_app

#: Commands that run until stopped and print no result to parse.
WITHOUT_JSON = {"serve", "dashboard"}


def _commands() -> dict[str, Any]:
    """Every runnable command by its full name; a group that runs without a subcommand counts too.
    (Typer may bundle its own click, so commands are told apart by behaviour, not by class.)"""
    root = typer.main.get_command(build_app())
    out: dict[str, Any] = {}

    def walk(cmd: Any, name: str, ctx: Any) -> None:
        if hasattr(cmd, "list_commands"):
            if cmd.invoke_without_command and name:
                out[name] = cmd
            for sub in cmd.list_commands(ctx):
                child = cmd.get_command(ctx, sub)
                walk(child, f"{name} {sub}".strip(), child.context_class(child, parent=ctx))
        else:
            out[name] = cmd

    walk(root, "", root.context_class(root))
    return out


def test_every_command_but_serve_and_dashboard_takes_json():
    commands = _commands()
    assert WITHOUT_JSON <= set(commands) and "route train" in commands
    lacking = {name for name, cmd in commands.items() if not any("--json" in getattr(p, "opts", ()) for p in cmd.params)}
    assert lacking == WITHOUT_JSON


def test_route_train_json(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    for model, correct in (("weak", lambda i: i % 3 != 0), ("strong", lambda i: True)):
        rows = [{"task": f"t{i}", "prompt": f"task number {i} {'hard' if i % 3 == 0 else 'easy'}", "correct": correct(i)}
                for i in range(24)]
        (results / f"{model}.results.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "router.json"
    result = CliRunner().invoke(build_app(), ["route", "train", "--weak", "weak", "--strong", "strong",
                                              "--results", str(results), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"weak": "weak", "strong": "strong", "num_tasks": 24,
                                         "num_need_strong": 8, "out": str(out)}
    assert out.is_file()
