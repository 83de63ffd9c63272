"""Regenerate docs/hooks.md from tokenops/hookspecs.py: `python scripts/gen_hooks_doc.py`."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from tokenops import hookspecs
from tokenops.blocking import MAY_BLOCK_HOOKS

TITLES = {
    "setup": "Setup and lifecycle",
    "multi_model": "Layer 1 — multi-model fusion (gateway)",
    "model_optimization": "Layer 2 — model optimization (engine)",
    "compute_model": "Layer 3 — compute-model fusion (engine + tuner)",
    "compute_network": "Layer 4 — compute-network-model fusion (gateway)",
    "telemetry": "Telemetry",
}


def signature_line(fn) -> str:
    # Annotations are strings (``from __future__ import annotations``): print them bare.
    sig = inspect.signature(fn)
    params = ", ".join(f"{p.name}: {p.annotation}" for p in sig.parameters.values())
    return f"def {fn.__name__}({params}) -> {sig.return_annotation}"


def runs_on(fn) -> str:
    """The ``Runs on:`` line of a hookspec's docstring (tests/test_hookspecs.py requires one)."""
    doc = inspect.cleandoc(fn.__doc__ or "")
    found = re.search(r"^Runs on: (.+?)(?=\n\s*\n|\n:param|\n:returns|\Z)", doc, flags=re.M | re.S)
    return " ".join(found.group(1).split()) if found else ""


def thread_label(fn) -> str:
    """The first sentence of :func:`runs_on`, for the summary table."""
    text = re.split(r"\.\s|\.$", runs_on(fn))[0]
    return re.sub(r":\w+:`([^`]+)`|``([^`]+)``", lambda m: f"`{m.group(1) or m.group(2)}`", text)


def render() -> str:
    out = [
        "# Hook reference",
        "",
        "Every hook a plugin can implement, by layer. Implement one with `@tokenops.hookimpl` and a function",
        "of the same name taking any subset of the listed arguments (by name). Generated from",
        "`tokenops/hookspecs.py` by `scripts/gen_hooks_doc.py`; `tests/test_docs.py` fails when a hook is",
        "missing here or its signature differs, `tests/test_hookspecs.py` when this page is not the generated",
        "text (edit the docstrings, then regenerate). The signature blocks are marked",
        "`<!-- docs-test: skip (signature) -->` so `tests/test_docs_examples.py`, which runs the docs' code",
        "blocks, leaves them out.",
        "",
        "**firstresult**: the hook stops at the first implementation that returns something other than",
        "`None` — the first non-None result wins; return `None` to pass. Implementations are called in",
        "LIFO registration order, adjusted by `@hookimpl(tryfirst=True)` / `trylast=True`.",
        "",
        "**Runs on** says which thread calls the hook. On *the event loop* (the gateway's asyncio loop, which",
        "serves every connection) an implementation that blocks — CPU work such as embedding a text, disk or",
        "network I/O — stalls every client, `/health` included. Mark such an implementation",
        "`@tokenops.may_block` (optionally `@may_block(when=predicate)`, the predicate taking any of the hook's",
        "arguments by name): the gateway then calls that hook in a worker thread, while unmarked, cheap",
        "implementations pay no thread hop. Only "
        + ", ".join(f"`{n}`" for n in sorted(MAY_BLOCK_HOOKS))
        + " honour the mark; on any other hook it is refused at load. *A worker thread* (`asyncio.to_thread`)",
        "may block, but runs concurrently with other requests: guard shared state. *The engine thread* is the",
        "bundled engine's step loop: time spent there delays the whole batch. *Build time* is once, while the",
        "gateway, an engine or the CLI is set up. See docs/plugins.md, \"Blocking work\".",
        "",
        "| hook | layer | firstresult | runs on |",
        "|---|---|---|---|",
    ]
    for layer in hookspecs.LAYERS:
        for name in [n for n, lay in hookspecs.HOOK_LAYERS.items() if lay == layer]:
            fn = getattr(hookspecs, name)
            first = "yes" if (getattr(fn, "tokenops_spec", {}) or {}).get("firstresult") else ""
            out.append(f"| [`{name}`](#{name}) | {layer} | {first} | {thread_label(fn)} |")
    out.append("")
    for layer in hookspecs.LAYERS:
        names = [n for n, lay in hookspecs.HOOK_LAYERS.items() if lay == layer]
        out += [f"## {TITLES[layer]}", ""]
        for name in names:
            fn = getattr(hookspecs, name)
            opts = getattr(fn, "tokenops_spec", {}) or {}
            flags = [k for k in ("firstresult", "historic") if opts.get(k)]
            out += [f"### `{name}`", ""]
            if flags:
                out += [f"*{', '.join(flags)}*", ""]
            # a signature, not code to run: tests/test_docs_examples.py skips it
            out += ["<!-- docs-test: skip (signature) -->", "```python", signature_line(fn), "```", "",
                    inspect.cleandoc(fn.__doc__ or ""), ""]
    return "\n".join(out)


if __name__ == "__main__":
    path = Path(__file__).resolve().parents[1] / "docs" / "hooks.md"
    path.write_text(render())
    print(f"wrote {path}")
