"""``tokenops route``: train and calibrate the threshold router."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from tokenops.cli.options import JsonOpt, StoreOpt

route_app = typer.Typer(help="Layer-1 routing tools.", no_args_is_help=True)


@route_app.command("calibrate")
def calibrate_command(
    strong_share: Annotated[float, typer.Option("--strong-share", help="Share of traffic to send to the strong model.")],
    store: StoreOpt = None,
    out: Annotated[Path, typer.Option("--out", help="Where to write the threshold.")] = Path("profiles/routers/threshold.toml"),
    as_json: JsonOpt = False,
) -> None:
    """Set the threshold router's threshold from its scores on recorded traffic."""
    from tokenops.cli import UserError
    from tokenops.config import load_settings
    from tokenops.store import open_store
    from tokenops_plugins.multi_model._calibration import calibrate_share

    path = store or load_settings().store.path
    if not Path(path).is_file():
        raise UserError(f"store {path} does not exist; serve traffic through the threshold router first")
    with open_store(path, read_only=True) as db:  # through the server when one holds the file
        rows = db.execute("SELECT decisions FROM requests WHERE decisions IS NOT NULL").fetchall()
    scores = []
    for (text,) in rows:
        route = (json.loads(text) if isinstance(text, str) else text or {}).get("route") or {}
        if route.get("router") == "threshold" and route.get("score") is not None:
            scores.append(float(route["score"]))
    try:
        threshold, share = calibrate_share(scores, strong_share)
    except ValueError as e:
        raise UserError(str(e)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"threshold = {threshold!r}\nstrong_share = {share!r}\nrequested_share = {strong_share!r}\n"
                   f"samples = {len(scores)}\n")
    result = {"threshold": threshold, "strong_share": share, "requested_share": strong_share,
              "distinct_scores": len(set(scores)), "samples": len(scores), "file": str(out)}
    if as_json:
        typer.echo(json.dumps(result))
        return
    note = "" if abs(share - strong_share) < 0.5 / len(scores) + 1e-9 else (
        f" (asked for {strong_share:.0%}; the {len(set(scores))} distinct recorded score(s) allow no closer share)")
    typer.echo(f"threshold {threshold:.4f} sends {share:.0%} of {len(scores)} recorded requests to the strong "
               f"model{note}; wrote {out}")


@route_app.command("train")
def train_command(
    weak: Annotated[str, typer.Option("--weak", help="The cheap model's name.")],
    strong: Annotated[str, typer.Option("--strong", help="The strong model's name.")],
    results_dir: Annotated[Path, typer.Option("--results", help="Folder with <model>.results.jsonl from `tokenops profile`.")] = Path("profiles/models"),
    out: Annotated[Path, typer.Option("--out")] = Path("profiles/routers/win_predictor.json"),
    as_json: JsonOpt = False,
) -> None:
    """Train the win predictor from two models' per-task profile results."""
    from tokenops.cli import UserError
    from tokenops_plugins.multi_model._text_model import Logistic

    def load(model: str) -> dict[str, dict]:
        path = results_dir / f"{model.replace('/', '_')}.results.jsonl"
        if not path.is_file():
            raise UserError(f"{path} not found; run `tokenops profile {model}` first")
        return {r["task"]: r for r in map(json.loads, path.read_text().splitlines()) if r}

    w, s = load(weak), load(strong)
    common = sorted(set(w) & set(s))
    if len(common) < 20:
        raise UserError(f"only {len(common)} tasks profiled for both models; profile more (at least 20)")
    texts = [w[t]["prompt"] for t in common]
    targets = [float((not w[t]["correct"]) and s[t]["correct"]) for t in common]
    Logistic().fit(texts, targets).save(out.parent.mkdir(parents=True, exist_ok=True) or out)
    if as_json:
        typer.echo(json.dumps({"weak": weak, "strong": strong, "num_tasks": len(common),
                               "num_need_strong": int(sum(targets)), "out": str(out)}))
        return
    typer.echo(f"trained on {len(common)} tasks ({int(sum(targets))} need the strong model); wrote {out}")


def register(app: typer.Typer) -> None:
    app.add_typer(route_app, name="route")
