"""The hook contract says what it keeps: every hookspec is typed with real types, says when it
is called and on which thread it runs, and firstresult hooks say that the first non-None
result wins. ``@may_block`` moves a hook off the event loop only when it is needed."""

from __future__ import annotations

import ast
import inspect
import threading
import typing
from pathlib import Path

import pytest
from tokenops import hookimpl, hookspecs, may_block
from tokenops.blocking import MAY_BLOCK_HOOKS, blocking_mark

SPECS = sorted(hookspecs.HOOK_LAYERS)
BARE_ANY = {"Any", "Any | None", "typing.Any", "Optional[Any]"}


def _type_namespace() -> dict:
    """hookspecs' globals plus what its ``if TYPE_CHECKING:`` block imports (as a type checker sees it)."""
    source = Path(hookspecs.__file__).read_text()
    block = next(
        n for n in ast.parse(source).body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING"
    )
    ns = dict(vars(hookspecs))
    exec(compile(ast.Module(body=block.body, type_ignores=[]), hookspecs.__file__, "exec"), ns)
    return ns


def untyped_without_reason(fn, reasons: dict[str, str]) -> list[str]:
    """``hook.param`` / ``hook.return`` that are unannotated or bare ``Any`` with no reason in ``reasons``."""
    sig = inspect.signature(fn)
    found = []
    for where, annotation in [
        *((p.name, p.annotation) for p in sig.parameters.values()),
        ("return", sig.return_annotation),
    ]:
        key = f"{fn.__name__}.{where}"
        if (annotation is inspect.Signature.empty or str(annotation).strip() in BARE_ANY) and not reasons.get(key):
            found.append(key)
    return found


def thread_problems(fn) -> list[str]:
    """What the docstring of a hookspec lacks: when it is called, the thread, the firstresult rule."""
    doc = inspect.cleandoc(fn.__doc__ or "")
    problems = []
    if "Called " not in doc:
        problems.append("no 'Called ...' sentence saying when")
    runs_on = [line for line in doc.splitlines() if line.startswith("Runs on: ")]
    if len(runs_on) != 1:
        problems.append("no single 'Runs on: ...' line")
    elif not any(
        w in runs_on[0] for w in ("event loop", "worker thread", "engine thread", "main thread", "build time")
    ):
        problems.append(f"'Runs on:' names no known thread: {runs_on[0]!r}")
    opts = getattr(fn, "tokenops_spec", None) or {}
    if opts.get("firstresult") and "First non-None result wins" not in " ".join(doc.split()):
        problems.append("firstresult without 'First non-None result wins'")
    return problems


# -- the contract -------------------------------------------------------------------------


@pytest.mark.parametrize("name", SPECS)
def test_hookspec_is_typed(name):
    assert untyped_without_reason(getattr(hookspecs, name), hookspecs.UNTYPED) == []


def test_every_type_named_by_a_hookspec_exists():
    ns = _type_namespace()
    for name in SPECS:
        hints = typing.get_type_hints(getattr(hookspecs, name), globalns=ns)  # NameError/ImportError if stale
        assert set(hints) >= set(inspect.signature(getattr(hookspecs, name)).parameters) | {"return"}, name


def test_untyped_reasons_are_not_stale():
    for key in hookspecs.UNTYPED:
        hook, _, where = key.partition(".")
        sig = inspect.signature(getattr(hookspecs, hook))
        annotation = sig.return_annotation if where == "return" else sig.parameters[where].annotation
        assert str(annotation) in BARE_ANY, f"{key} is typed now: drop it from hookspecs.UNTYPED"


@pytest.mark.parametrize("name", SPECS)
def test_hookspec_says_when_and_on_which_thread(name):
    assert thread_problems(getattr(hookspecs, name)) == []


def test_the_checks_catch_an_untyped_or_threadless_spec():
    @hookspecs.hookspec(firstresult=True)
    def tokenops_example(request: typing.Any, count: int, other) -> typing.Any:
        """Does something.

        :param request: a request.
        """

    assert untyped_without_reason(tokenops_example, {}) == [
        "tokenops_example.request",
        "tokenops_example.other",
        "tokenops_example.return",
    ]
    assert (
        untyped_without_reason(
            tokenops_example,
            {"tokenops_example.request": "why", "tokenops_example.other": "x", "tokenops_example.return": "y"},
        )
        == []
    )
    assert len(thread_problems(tokenops_example)) == 3
    tokenops_example.__doc__ = (
        "Does something.\n\nCalled once.\n\nRuns on: the event loop.\n\n:returns: a thing. First non-None result wins."
    )
    assert thread_problems(tokenops_example) == []


def test_may_block_hooks_are_gateway_hooks_that_say_so():
    for name in MAY_BLOCK_HOOKS:
        assert "@may_block" in inspect.getdoc(getattr(hookspecs, name)), name


# -- @may_block ---------------------------------------------------------------------------


def test_may_block_marks_with_an_optional_predicate_on_some_arguments():
    @may_block
    def always(request):
        return None

    @may_block(when=lambda request: request == "slow")
    def sometimes(request, candidates):
        return None

    @may_block(when=lambda **kw: "profiles" in kw)
    def by_kwargs():
        return None

    assert blocking_mark(always).applies({"request": 1})
    assert blocking_mark(sometimes).argnames == ("request",)
    assert blocking_mark(sometimes).applies({"request": "slow", "candidates": []})
    assert not blocking_mark(sometimes).applies({"request": "fast", "candidates": []})
    assert blocking_mark(by_kwargs).applies({"profiles": {}})
    assert blocking_mark(lambda: None) is None


def test_may_block_on_a_hook_that_cannot_move_is_refused_at_load(register_plugin):
    from tokenops.plugin_manager import PluginLoadError

    class Replica:
        @hookimpl
        @may_block
        def tokenops_select_replica(self, request, replicas):
            return None

    with pytest.raises(PluginLoadError, match="only .*tokenops_route.* can move off the event loop"):
        register_plugin(Replica())

    class BadPredicate:
        @hookimpl
        @may_block(when=lambda prompt: True)
        def tokenops_route(self, request):
            return None

    with pytest.raises(PluginLoadError, match="predicate takes prompt"):
        register_plugin(BadPredicate())


def _chat(text: str, model: str = "fake-model") -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 4}


async def test_unmarked_hooks_stay_on_the_loop_and_marked_ones_move(register_plugin, gateway):
    seen: dict[str, int] = {}

    class Router:
        @hookimpl
        @may_block(when=lambda request: "heavy" in request.prompt_text())
        def tokenops_route(self, request, candidates):
            seen["route"] = threading.get_ident()

        @hookimpl
        def tokenops_validate(self, request, response):
            seen["validate"] = threading.get_ident()

        @hookimpl
        def tokenops_cache_store(self, request, response):
            seen["cache_store"] = threading.get_ident()

    register_plugin(Router())
    loop_thread = threading.get_ident()  # the in-process gateway serves on this test's loop
    assert (await gateway.post("/v1/chat/completions", json=_chat("light"))).status_code == 200
    assert seen == {"route": loop_thread, "validate": loop_thread, "cache_store": loop_thread}

    assert (await gateway.post("/v1/chat/completions", json=_chat("heavy"))).status_code == 200
    assert seen["route"] != loop_thread
    assert seen["validate"] == seen["cache_store"] == loop_thread  # only the marked hook moved


def test_semantic_router_is_blocking_only_when_it_routes():
    from tokenops.config import Settings
    from tokenops.gateway.core import hooks
    from tokenops.plugin_manager import get_plugin_manager
    from tokenops.types import GatewayRequest

    semantic_router = get_plugin_manager().get_plugin("semantic_router")  # the process-wide instance

    def request(model: str) -> GatewayRequest:
        return GatewayRequest(kind="chat", model=model, body={}, messages=[{"role": "user", "content": "hi"}])

    def blocking(model: str) -> bool:
        return hooks.is_blocking("tokenops_route", request=request(model), candidates=["a"], profiles={})

    assert not blocking("auto")
    settings = Settings()
    settings.plugins["router"] = {
        "use": "semantic",
        "default": "a",
        "semantic": {"embedder": "lexical", "routes": [{"model": "a", "examples": ["hello"]}]},
    }
    semantic_router.tokenops_configure(settings)
    try:
        assert blocking("auto") and not blocking("a")  # only requests for the router's alias embed
    finally:
        semantic_router.tokenops_configure(Settings())
    assert not blocking("auto")


def test_docs_hooks_md_is_the_generated_reference():
    import sys

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "scripts"))
    try:
        from gen_hooks_doc import render
    finally:
        sys.path.pop(0)
    assert (root / "docs" / "hooks.md").read_text() == render(), "docs/hooks.md is stale: run scripts/gen_hooks_doc.py"


def test_may_block_predicate_of_a_plugin_class_takes_its_instance(register_plugin):
    """A class plugin's ``@may_block(when=...)`` predicate may take ``self``: whether this instance blocks."""
    from tokenops.gateway.core.hooks import is_blocking

    class Store:
        def __init__(self) -> None:
            self.is_embedding = False

        @hookimpl
        @may_block(when=lambda self, request: self.is_embedding and request is not None)
        def tokenops_cache_store(self, request, response):
            return None

    plugin = Store()
    register_plugin(plugin, "store-test")
    assert not is_blocking("tokenops_cache_store", request=object(), response=None)
    plugin.is_embedding = True
    assert is_blocking("tokenops_cache_store", request=object(), response=None)
    assert not is_blocking("tokenops_cache_store", request=None, response=None)
