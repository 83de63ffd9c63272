"""The options of ``tokenops tune`` as ``Annotated`` aliases (as ``bench_options.py`` for ``bench``).

Declared here, the command's signature is one line per flag and ``tune.py`` holds only the
option handling around ``tokenops.tune``'s session. The SLO and length options are ``bench``'s.
"""

from __future__ import annotations

from typing import Annotated

import typer

TuneUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="A running server: its live tunables are searched (default: the `tokenops serve` of this folder, else --launch).",
        envvar="TOKENOPS_URL",
    ),
]
LaunchOpt = Annotated[
    bool,
    typer.Option("--launch", help="Launch the engine, relaunched per configuration (restart tunables searched too)."),
]
EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine", help="With --launch: tokenops (bundled), vllm or sglang; any launcher a plugin registers."
    ),
]
ModelPathOpt = Annotated[
    str | None,
    typer.Option(
        "--model-path",
        "--model",
        help="With --launch: model folder (default: the embedded demo model); vllm/sglang also take a hub id.",
    ),
]
LauncherCmdOpt = Annotated[
    str | None,
    typer.Option(
        "--launcher-cmd", help="With --launch: the command that starts the engine, e.g. '/opt/vllm/bin/vllm serve'."
    ),
]
LauncherArgOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--launcher-arg",
        help="With --launch: extra engine arguments, e.g. --launcher-arg='--tensor-parallel-size 2' (repeatable).",
    ),
]
ReadyTimeoutOpt = Annotated[
    float, typer.Option("--ready-timeout", help="With --launch: seconds a launched engine may take to become ready.")
]

# workload (see tokenops bench)
WorkloadOpt = Annotated[str, typer.Option("--workload", "-w", help="Workload name (see tokenops bench).")]
DatasetOpt = Annotated[
    str | None, typer.Option("--dataset", help="file workload: JSON Lines of requests (see tokenops bench).")
]
HistoryStoreOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--history-store",
        help="replay workload: the stores whose recorded requests it replays; repeat it to read several "
        "gateway replicas' stores as one (docs/deploy.md). Default: --store.",
    ),
]
InputLenOpt = Annotated[int, typer.Option("--input-len", help="Synthetic prompt tokens.")]
OutputLenOpt = Annotated[int, typer.Option("--output-len", help="Synthetic answer tokens.")]
MaxInputLenOpt = Annotated[int, typer.Option("--max-input-len", help="ShareGPT prompt cap (tokens).")]
MaxOutputLenOpt = Annotated[int, typer.Option("--max-output-len", help="ShareGPT answer cap (tokens).")]

# the search
BudgetOpt = Annotated[
    str,
    typer.Option(
        "--budget",
        help="Trials (20) or wall time (10m, 90s); the default keeps a study on the demo engine under 10 minutes.",
    ),
]
OnlyOpt = Annotated[
    list[str] | None, typer.Option("--only", help="Search only these tunables or dotted prefixes (repeatable).")
]
ExcludeOpt = Annotated[
    list[str] | None, typer.Option("--exclude", help="Leave these tunables or prefixes at their values.")
]
ParamOpt = Annotated[
    list[str] | None, typer.Option("--param", help="Candidates for a tunable: NAME=v1,v2,... (repeatable).")
]
MeasureSecondsOpt = Annotated[float, typer.Option("--measure-seconds", help="Length of one rate measurement.")]
MinRequestsOpt = Annotated[int, typer.Option("--min-requests", help="Fewest requests per measurement.")]
MaxMeasurementsOpt = Annotated[int, typer.Option("--max-measurements", help="Rate measurements per trial.")]
StartRateOpt = Annotated[float | None, typer.Option("--start-rate", help="First rate tried (default: probed).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the search, workload and arrivals.")]

# what happens to the winner
ApplyOpt = Annotated[
    bool,
    typer.Option(
        "--apply",
        help="Push the winner's live tunables to the running server (this folder's, or --url with --admin-key); restart ones are listed for the next start.",
    ),
]
ValidateOpt = Annotated[
    bool,
    typer.Option(
        "--validate", help="Afterwards re-measure default and winner back to back at the winner's goodput (extra time)."
    ),
]
ProfileDirOpt = Annotated[str, typer.Option("--profile-dir", help="Where the winner's profile is written.")]
NoStoreOpt = Annotated[bool, typer.Option("--no-store", help="Do not save trials in the store.")]
