#!/usr/bin/env python
"""Generate the semantic cache evaluation set: tests/data/semantic_cache_eval.jsonl.

    .venv/bin/python scripts/make_semantic_cache_eval.py          # writes the file
    .venv/bin/python scripts/make_semantic_cache_eval.py --check  # fails if the file is stale

Look-alike pairs (must miss) come from the templates and variants in
``semantic_cache_seeds.py``; paraphrase pairs (should hit) from how-to / what-is / why
cores put into question frames, plus hand-written pairs with other words.

The held-out split was fixed before any tuning and tuning never reads it: a seed (a
look-alike template, a paraphrase core or a hand-written pair) is held out when
``blake2b("semcache-split-v1:" + seed)`` mod 10 is below 3, and held-out paraphrase
cores are put only into frames of their own (``*_FRAMES_HELDOUT``), so the held-out
part holds topics, words and question shapes the tuning part never shows. Output is
deterministic (no randomness, sorted keys).

A third part, ``fresh``, was written after the held-out part had been scored once (see
``FRESH_LOOKALIKES`` in the seeds): it is held out from every change since.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import semantic_cache_seeds as seeds  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "semantic_cache_eval.jsonl"


def split_of(seed: str) -> str:
    h = int.from_bytes(hashlib.blake2b(("semcache-split-v1:" + seed).encode(), digest_size=8).digest(), "little")
    return "heldout" if h % 10 < 3 else "tune"


def _clean(text: str) -> str:
    return " ".join(text.split()).replace(" ?", "?").replace(" .", ".")


def lookalikes(table: dict | None = None, fixed_split: str | None = None) -> list[dict]:
    rows: list[dict] = []
    for kind, templates in (seeds.LOOKALIKES if table is None else table).items():
        for template, variants in templates:
            split = fixed_split or split_of(template)
            if isinstance(variants[0], tuple):  # swapped operands
                pairs = [(template.format(x, y), template.format(y, x)) for x, y in variants]
            else:
                pairs = [(template.format(variants[0]), template.format(v)) for v in variants[1:]]
            for a, b in pairs:
                rows.append({"a": _clean(a), "b": _clean(b), "kind": kind, "should_hit": False, "split": split,
                             "seed": template})
                if b.startswith("How do I "):  # the same change in another question frame: closer still
                    frames = seeds.HOWTO_FRAMES_HELDOUT if split == "heldout" else seeds.HOWTO_FRAMES_TUNE
                    frame = frames[len(rows) % len(frames)]
                    rows.append({"a": _clean(a), "b": _clean(frame.format(b.removeprefix("How do I ").rstrip("?"))),
                                 "kind": kind, "should_hit": False, "split": split, "seed": template})
    return rows


def paraphrases() -> list[dict]:
    rows = []

    def add(kind: str, seed: str, a: str, frames_tune: list[str], frames_heldout: list[str], fill, per_seed: int,
            index: int) -> None:
        split = split_of(seed)
        frames = frames_heldout if split == "heldout" else frames_tune
        for k in range(per_seed):
            frame = frames[(index + k) % len(frames)]
            rows.append({"a": a, "b": _clean(fill(frame)), "kind": kind, "should_hit": True, "split": split,
                         "seed": seed})

    for i, vp in enumerate(seeds.HOWTO):
        add("paraphrase_frame", vp, f"How do I {vp}?", seeds.HOWTO_FRAMES_TUNE, seeds.HOWTO_FRAMES_HELDOUT,
            lambda f, vp=vp: f.format(vp), 3, i)
    for i, np_ in enumerate(seeds.WHATIS):
        add("paraphrase_frame", np_, f"What is {np_}?", seeds.WHATIS_FRAMES_TUNE, seeds.WHATIS_FRAMES_HELDOUT,
            lambda f, np_=np_: f.format(np_), 2, i)
    for i, (q, d) in enumerate(seeds.WHY):
        add("paraphrase_frame", q, f"Why {q}?", seeds.WHY_FRAMES_TUNE, seeds.WHY_FRAMES_HELDOUT,
            lambda f, q=q, d=d: f.format(q=q, d=d), 2, i)
    for a, b in seeds.HANDWRITTEN:
        rows.append({"a": a, "b": b, "kind": "paraphrase_words", "should_hit": True, "split": split_of(a), "seed": a})
    return rows


def fresh() -> list[dict]:
    rows = lookalikes(seeds.FRESH_LOOKALIKES, "fresh")
    rows += [{"a": a, "b": b, "kind": "paraphrase_fresh", "should_hit": True, "split": "fresh", "seed": a}
             for a, b in seeds.FRESH_HANDWRITTEN]
    return rows


def build() -> str:
    rows = lookalikes() + paraphrases() + fresh()
    texts_a = {r["a"] for r in rows}
    # a look-alike's b must never be another pair's a: scoring stores every a
    assert not any(r["b"] in texts_a for r in rows if not r["should_hit"]), "a look-alike b is also a stored a"
    assert len({(r["a"], r["b"]) for r in rows}) == len(rows), "duplicate pairs"
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="fail when the checked-in file differs")
    args = p.parse_args()
    text = build()
    rows = [json.loads(line) for line in text.splitlines()]
    for split in ("tune", "heldout", "fresh"):
        part = [r for r in rows if r["split"] == split]
        print(f"{split:8} look-alikes {sum(not r['should_hit'] for r in part):4}  "
              f"paraphrases {sum(r['should_hit'] for r in part):4}")
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT} is stale: rerun {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {len(rows)} pairs to {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
