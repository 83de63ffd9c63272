import json
import subprocess
import sys
import textwrap

import pytest

from tokenops import hookimpl
from tokenops import plugin_manager as plugins
from tokenops.hookspecs import LAYERS
from tokenops.types import GatewayRequest


@pytest.fixture
def fresh_plugins(monkeypatch):
    """A plugin manager rebuilt for this test, and rebuilt again afterwards."""
    monkeypatch.delenv("TOKENOPS_PLUGINS", raising=False)
    monkeypatch.delenv("TOKENOPS_LOAD_PLUGINS", raising=False)
    monkeypatch.delenv("TOKENOPS_TRACE_PLUGINS", raising=False)
    plugins.reset()
    try:
        yield plugins
    finally:
        plugins.reset()


def write_plugin(tmp_path, name, body):
    path = tmp_path / f"{name}.py"
    path.write_text("from tokenops import hookimpl\n" + textwrap.dedent(body))
    return path


def test_builtins_load_through_entry_points(fresh_plugins):
    infos = {p.name: p for p in fresh_plugins.list_plugins()}
    assert infos["schedule_fcfs"].source == "builtin"
    assert infos["schedule_fcfs"].layer == "compute_model"
    # the engine's tunables come from the engine itself, not from a plugin
    assert fresh_plugins.get_tunables()["engine.max_num_seqs"].plugin == "engine"
    assert not any("engine.max_num_seqs" in p.tunables for p in infos.values())
    assert all(p.layer in LAYERS for p in infos.values())


def test_unknown_hook_fails_with_one_line_naming_plugin_and_hook(fresh_plugins, tmp_path, monkeypatch):
    path = write_plugin(tmp_path, "typo", "@hookimpl\ndef tokenops_rout(request):\n    return None\n")
    monkeypatch.setenv("TOKENOPS_PLUGINS", str(path))
    with pytest.raises(plugins.PluginLoadError) as e:
        fresh_plugins.get_plugin_manager()
    msg = str(e.value)
    assert "file:typo" in msg and "tokenops_rout" in msg and "\n" not in msg


def test_wrong_arguments_fail(fresh_plugins, tmp_path):
    path = write_plugin(tmp_path, "badargs", "@hookimpl\ndef tokenops_route(request, models):\n    return None\n")
    fresh_plugins.get_plugin_manager()
    with pytest.raises(plugins.PluginLoadError, match=r"tokenops_route.*models"):
        fresh_plugins.add_plugin_file(str(path))


def test_allow_list_limits_entry_points(fresh_plugins, monkeypatch):
    monkeypatch.setenv("TOKENOPS_LOAD_PLUGINS", "schedule_fcfs")
    names = {p.name for p in fresh_plugins.list_plugins()}
    assert names == {"schedule_fcfs"} | plugins.DEFAULT_PLUGINS  # the defaults always load


def test_engine_tunables_need_no_plugin_and_take_registered_orders(fresh_plugins, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENOPS_LOAD_PLUGINS", "")  # the defaults only: the engine's tunables are there
    path = write_plugin(tmp_path, "lifo", "@hookimpl\ndef tokenops_register_schedule_orders(register):\n"
                                          "    register('lifo', lambda waiting: list(reversed(waiting)))\n")
    monkeypatch.setenv("TOKENOPS_PLUGINS", str(path))
    registry = fresh_plugins.get_tunables()
    assert registry["engine.max_num_seqs"].plugin == "engine" and registry["engine.max_num_seqs"].live
    assert registry["engine.schedule_policy"].choices == ("fcfs", "priority", "lifo")


def test_file_plugin_hooks_are_called_and_tunables_registered(fresh_plugins, tmp_path, monkeypatch):
    path = write_plugin(
        tmp_path,
        "shout",
        """
        from tokenops.tunables import Tunable
        from tokenops.types import RouteDecision

        @hookimpl
        def tokenops_register_tunables(register):
            register(Tunable("shout.level", "int", 3, "how loud", live=True, minimum=0, maximum=10))

        @hookimpl
        def tokenops_route(request, candidates, profiles):
            return RouteDecision(model=candidates[-1], reason="shout: last candidate")
        """,
    )
    monkeypatch.setenv("TOKENOPS_PLUGINS", str(path))
    pm = fresh_plugins.get_plugin_manager()
    req = GatewayRequest(kind="chat", model="a", body={}, messages=[{"role": "user", "content": "hi"}])
    decision = pm.hook.tokenops_route(request=req, candidates=["a", "b"], profiles={})
    assert decision.model == "b" and decision.reason.startswith("shout")
    assert fresh_plugins.get_tunables()["shout.level"].plugin == "file:shout"
    info = next(p for p in fresh_plugins.list_plugins() if p.name == "file:shout")
    assert info.layer == "multi_model" and info.tunables == ["shout.level"]


def test_register_and_unregister_runtime_plugin(fresh_plugins):
    class Admit:
        @hookimpl
        def tokenops_admit(self, request):
            return "no"

    name = fresh_plugins.register_plugin(Admit(), name="admit-test")
    try:
        assert fresh_plugins.hook().tokenops_admit(request=None) == "no"
    finally:
        fresh_plugins.unregister_plugin(name)
    assert fresh_plugins.hook().tokenops_admit(request=None) is None


def test_trace_env_prints_hook_calls(tmp_path):
    code = "from tokenops.plugin_manager import hook; hook().tokenops_register_schedule_orders(register=lambda n, o: None)"
    env = {"TOKENOPS_TRACE_PLUGINS": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "[tokenops hook] tokenops_register_schedule_orders" in out.stderr
    assert "-> ['schedule_fcfs', 'schedule_priority']" in out.stderr and "= []" in out.stderr


def test_plugins_json_groups_by_layer():
    from typer.testing import CliRunner

    from tokenops.cli import build_app

    result = CliRunner().invoke(build_app(), ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(LAYERS) <= set(data["layers"])
    tunable = next(t for t in data["core_tunables"]["engine"] if t["name"] == "engine.max_num_seqs")
    assert tunable["live"] is True and tunable["minimum"] == 1
