"""The pytest fixtures ``tokenops.testing`` gives plugin authors (loaded through
the ``pytest11`` entry point, with no conftest)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tokenops import hookimpl
from tokenops.plugin_manager import get_plugin_manager, hook
from tokenops.types import TelemetryEvent


def test_tokenops_store_fixture_collects_recorded_events(tokenops_store):
    hook().tokenops_record(event=TelemetryEvent("requests", {"id": "from-a-plugin-test"}))
    tokenops_store.writer().flush()
    assert tokenops_store.execute("SELECT id FROM requests").fetchall() == [("from-a-plugin-test",)]


def test_register_plugin_fixture_registers(register_plugin):
    class Recorder:
        seen: list = []

        @hookimpl
        def tokenops_record(self, event):
            self.seen.append(event.kind)

    plugin = Recorder()
    name = register_plugin(plugin, name="recorder-under-test")
    assert get_plugin_manager().has_plugin(name)
    hook().tokenops_record(event=TelemetryEvent("custom", {}))
    assert plugin.seen == ["custom"]


_OUTSIDE_PROJECT = textwrap.dedent(
    """
    from tokenops import hookimpl
    from tokenops.plugin_manager import get_plugin_manager, hook
    from tokenops.types import TelemetryEvent


    class Broken:
        @hookimpl
        def tokenops_record(self, event):
            pass


    def test_fails_after_registering(register_plugin):
        register_plugin(Broken(), name="broken-plugin")
        assert False, "fails on purpose"


    def test_plugin_was_unregistered_and_store_is_fresh(tokenops_store):
        assert not get_plugin_manager().has_plugin("broken-plugin")
        assert tokenops_store.execute("SELECT count(*) FROM requests").fetchone() == (0,)
        hook().tokenops_record(event=TelemetryEvent("requests", {"id": "x"}))
        tokenops_store.writer().flush()
        assert tokenops_store.execute("SELECT count(*) FROM requests").fetchone() == (1,)
    """
)


def test_fixtures_are_available_without_conftest_and_undo_on_failure(tmp_path):
    (tmp_path / "test_author_plugin.py").write_text(_OUTSIDE_PROJECT)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
        env={**os.environ, "TOKENOPS_LOAD_PLUGINS": "duckdb_sink"},  # the sink alone keeps start-up short
    )
    assert "1 failed, 1 passed" in out.stdout, out.stdout + out.stderr
    assert "fails on purpose" in out.stdout
