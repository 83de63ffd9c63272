"""The screenshots in docs/dashboard/ are the snapshot-test images, kept in sync."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = Path(__file__).parent / "__snapshots__" / "test_snapshots"
DOCS = ROOT / "docs" / "dashboard"
SCREENSHOTS = {
    "overview.svg": "test_screen_snapshot[1-overview].svg",
    "engine.svg": "test_screen_snapshot[2-engine].svg",
    "models.svg": "test_screen_snapshot[3-models].svg",
    "experts.svg": "test_screen_snapshot[4-experts].svg",
    "tuning.svg": "test_screen_snapshot[5-tuning].svg",
    "history.svg": "test_screen_snapshot[6-history].svg",
    "tuning-rejected.svg": "test_tuning_rejected_edit.svg",
    "disconnected.svg": "test_disconnected_banner.svg",
    "overview-80x24.svg": "test_overview_at_80x24.svg",
}


def copy_all() -> None:
    """Refresh docs/dashboard/ from the accepted snapshots."""
    DOCS.mkdir(parents=True, exist_ok=True)
    for doc, snap in SCREENSHOTS.items():
        shutil.copyfile(SNAPSHOTS / snap, DOCS / doc)


@pytest.mark.parametrize("doc,snap", sorted(SCREENSHOTS.items()))
def test_doc_screenshot_matches_snapshot(doc, snap):
    fix = "run: python -c 'import sys; sys.path.insert(0, \"tests/tui\"); import test_docs_screenshots as t; t.copy_all()'"
    assert (DOCS / doc).is_file(), f"docs/dashboard/{doc} is missing; {fix}"
    assert (DOCS / doc).read_bytes() == (SNAPSHOTS / snap).read_bytes(), f"docs/dashboard/{doc} is stale; {fix}"


def test_dashboard_doc_shows_every_screen():
    text = (ROOT / "docs" / "dashboard.md").read_text()
    for doc in SCREENSHOTS:
        if doc != "overview-80x24.svg":
            assert f"(dashboard/{doc})" in text
