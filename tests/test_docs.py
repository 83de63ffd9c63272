"""Docs stay true to the code: every hook appears in docs/hooks.md with its exact signature."""

import re
from pathlib import Path

import pytest

from tokenops import hookspecs

ROOT = Path(__file__).resolve().parents[1]
HOOKS_MD = (ROOT / "docs" / "hooks.md").read_text()


def _spec_names():
    return sorted(hookspecs.HOOK_LAYERS)


@pytest.mark.parametrize("name", _spec_names())
def test_hook_documented_with_exact_signature(name):
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from gen_hooks_doc import signature_line
    finally:
        sys.path.pop(0)
    assert f"### `{name}`" in HOOKS_MD, f"docs/hooks.md has no section for {name}; run scripts/gen_hooks_doc.py"
    assert signature_line(getattr(hookspecs, name)) in HOOKS_MD, f"signature of {name} in docs/hooks.md is stale"


def test_no_documented_hook_that_does_not_exist():
    documented = set(re.findall(r"^### `(tokenops_\w+)`", HOOKS_MD, flags=re.M))
    assert documented == set(_spec_names())


def test_every_hookspec_has_a_docstring_with_params():
    for name in _spec_names():
        fn = getattr(hookspecs, name)
        doc = fn.__doc__ or ""
        assert doc.strip(), name
        for param in fn.__code__.co_varnames[: fn.__code__.co_argcount]:
            assert f":param {param}:" in doc, f"{name} does not document {param}"
