"""The store stays light: no textual (the TUI) and no torch (the engine)."""

import subprocess
import sys


def test_store_imports_neither_textual_nor_torch():
    code = (
        "import sys\n"
        "from tokenops.store import Store, TelemetryWriter, run_query, StoreError\n"
        "import tokenops.store.sink, tokenops_plugins.duckdb_sink, tokenops.cli.report\n"
        "print(sorted(m for m in ('textual', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_store_error_import_is_cheap():
    """The CLI imports StoreError on every run; that must not load DuckDB or SQLAlchemy."""
    code = "import sys\nfrom tokenops.store import StoreError\nprint(sorted(m for m in ('duckdb', 'sqlalchemy', 'sqlmodel') if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
