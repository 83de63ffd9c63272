"""Regenerate docs/hooks.md from tokenops/hookspecs.py: `python scripts/gen_hooks_doc.py`."""

from __future__ import annotations

import inspect
from pathlib import Path

from tokenops import hookspecs

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


def render() -> str:
    out = [
        "# Hook reference",
        "",
        "Every hook a plugin can implement, by layer. Implement one with `@tokenops.hookimpl` and a function",
        "of the same name taking any subset of the listed arguments (by name). Generated from",
        "`tokenops/hookspecs.py` by `scripts/gen_hooks_doc.py`; `tests/test_docs.py` fails when a hook is",
        "missing here or its signature differs. The signature blocks are marked",
        "`<!-- docs-test: skip (signature) -->` so `tests/test_docs_examples.py`, which runs the docs' code",
        "blocks, leaves them out.",
        "",
    ]
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
