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


def test_plugins_md_objects_are_generated_from_the_types():
    from tokenops.type_reference import current, render

    text = (Path(__file__).resolve().parents[1] / "docs" / "plugins.md").read_text()
    assert current(text) == render(), "docs/plugins.md drifted: run python -m tokenops.type_reference docs/plugins.md"


def test_last_user_message_is_what_the_user_asks_now():
    from tokenops.types import GatewayRequest

    turns = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"},
             {"role": "user", "content": [{"type": "text", "text": "second"}, {"type": "image_url", "image_url": {}}]},
             {"role": "assistant", "content": "done"}]
    assert GatewayRequest(kind="chat", model="m", body={}, messages=turns).last_user_message() == "second"
    assert GatewayRequest(kind="completion", model="m", body={}, prompt="p").last_user_message() == "p"
