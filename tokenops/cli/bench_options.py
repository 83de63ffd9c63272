"""The options of ``tokenops bench`` as ``Annotated`` aliases (as ``options.py`` holds the shared ones).

``bench`` takes some forty flags; declared here, its signature is one readable line per flag and
its body stays option handling plus calls into ``tokenops.bench``. ``SloOpt``, ``SloPresetOpt`` and
``LengthDistOpt`` are shared with ``tokenops tune``, which measures with the same load generator.
"""

from __future__ import annotations

from typing import Annotated

import typer

SloOpt = Annotated[list[str] | None, typer.Option("--slo", help="SLO like p95=200ms or tpot_p95=50ms (repeatable).")]
SloPresetOpt = Annotated[
    str | None, typer.Option("--slo-preset", help="Named SLOs from profiles/slo/NAME.toml (--slo adds/overrides).")
]
LengthDistOpt = Annotated[str, typer.Option("--length-dist", help="fixed | uniform | normal | lognormal.")]

# target and run shape
BenchUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="Base URL of the server (…/v1 accepted); default: the `tokenops serve` holding this folder's store.",
        envvar="TOKENOPS_URL",
    ),
]
ModelOpt = Annotated[str | None, typer.Option("--model", help="Model name (default: the first in /v1/models).")]
WorkloadOpt = Annotated[
    str,
    typer.Option(
        "--workload",
        "-w",
        help="synthetic | shared-prefix | sharegpt | sharegpt-multiturn | replay | file | a plugin's.",
    ),
]
DatasetOpt = Annotated[
    str | None,
    typer.Option(
        "--dataset", help='file: JSON Lines, one request per line ({"prompt" or "messages", "output_tokens"}).'
    ),
]
NumRequestsOpt = Annotated[
    int, typer.Option("--num-requests", "-n", help="Requests (conversations for multi-turn) per load level.")
]
RateOpt = Annotated[str | None, typer.Option("--rate", help="Requests/s, 'inf', or a sweep like 1,2,4.")]
ArrivalOpt = Annotated[str, typer.Option("--arrival", help="poisson | constant | gamma.")]
BurstinessOpt = Annotated[float, typer.Option("--burstiness", help="Gamma shape: 1 = Poisson, < 1 burstier.")]
ConcurrencyOpt = Annotated[
    str | None, typer.Option("--concurrency", help="Fixed requests in flight, or a sweep like 1,4,16.")
]

# workload shape
InputLenOpt = Annotated[int, typer.Option("--input-len", help="Synthetic prompt tokens (mean).")]
OutputLenOpt = Annotated[int, typer.Option("--output-len", help="Synthetic answer tokens (mean).")]
LengthSpreadOpt = Annotated[float, typer.Option("--length-spread", help="Relative std / half-width of lengths.")]
PrefixLenOpt = Annotated[int, typer.Option("--prefix-len", help="shared-prefix: system prompt tokens.")]
NumPrefixesOpt = Annotated[int, typer.Option("--num-prefixes", help="shared-prefix: distinct system prompts.")]
MaxInputLenOpt = Annotated[int, typer.Option("--max-input-len", help="ShareGPT: skip longer prompts (tokens).")]
MaxOutputLenOpt = Annotated[int, typer.Option("--max-output-len", help="ShareGPT: cap answer tokens.")]
MaxTurnsOpt = Annotated[int, typer.Option("--max-turns", help="sharegpt-multiturn: turns per conversation.")]
TimeScaleOpt = Annotated[
    float, typer.Option("--time-scale", help="replay: multiply recorded gaps (0.5 = twice as fast).")
]

# the requests sent
EndpointOpt = Annotated[str, typer.Option("--endpoint", help="chat | completions.")]
ApiKeyOpt = Annotated[str | None, typer.Option("--api-key", help="Bearer key for the target.", envvar="OPENAI_API_KEY")]
TemperatureOpt = Annotated[
    str,
    typer.Option(
        "--temperature", help="Sampling temperature sent with every request (0 = greedy), or 'server' to send none."
    ),
]
IgnoreEosOpt = Annotated[
    bool, typer.Option("--ignore-eos", help="Ask the server to ignore EOS (fixed answer lengths).")
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of workload and arrivals.")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Per-request timeout (s).")]
ThinkTimeOpt = Annotated[
    float,
    typer.Option(
        "--think-time", help="With --concurrency: seconds each client waits after an answer before its next request."
    ),
]
RampUpOpt = Annotated[
    float,
    typer.Option(
        "--ramp-up", help="With --concurrency: start the clients evenly over this many seconds (not in lockstep)."
    ),
]
ReusePromptsOpt = Annotated[
    bool,
    typer.Option(
        "--reuse-prompts",
        help="Send the same seeded prompts at every level and run (prefix-cache studies); default: fresh prompts per level and run.",
    ),
]

# results
PlotOpt = Annotated[str | None, typer.Option("--plot", help="Write a latency–throughput plot (.html or .png).")]
OutputOpt = Annotated[
    str | None, typer.Option("--output", "-o", help="Write the full run (with every request) as JSON.")
]
NoStoreOpt = Annotated[bool, typer.Option("--no-store", help="Do not save the run in the store.")]
AdminKeyFileOpt = Annotated[
    str | None,
    typer.Option(
        "--admin-key-file",
        help="With --url of another tokenops server: "
        "its admin key (first line of the file; or TOKENOPS_ADMIN_KEY), to save the run in that "
        "server's store.",
    ),
]
