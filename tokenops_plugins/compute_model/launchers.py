"""Servers ``tokenops tune --launch --engine NAME`` relaunches for every configuration:
the bundled engine, vLLM (``vllm serve``) and SGLang (``python -m sglang.launch_server``).

The vLLM and SGLang tunables are restart-only and reach the server as its own
command-line flags. Every searched tunable is passed, its default included, so a
trial runs exactly the values it records; tunables left out of the search are
not passed and the server picks them. The memory fractions are not searched by
default: they are the share of the GPU given to the server, not a speed knob
(``--param vllm.gpu_memory_utilization=0.85,0.9`` searches them anyway).
"""

import importlib.util
import os
import sys

from tokenops import hookimpl
from tokenops.tunables import Tunable
from tokenops.tune.errors import TuneError
from tokenops.tune.launcher import CommandLineLauncher, Flag, TokenopsLauncher

TOKENOPS_LAYER = "compute_model"


def _t(name, type_, default, help_, **kw):
    return Tunable(name, type_, default, help_ + " (restart)", live=False, **kw)


class VLLMLauncher(CommandLineLauncher):
    """``vllm serve MODEL``; the program is ``$TOKENOPS_VLLM_BIN`` or ``vllm`` on PATH."""

    name = "vllm"
    prefixes = ("vllm.",)
    flags = (
        Flag(
            _t(
                "vllm.max_num_seqs", "int", 256, "vLLM: most sequences in one batch.", minimum=1, maximum=4096, log=True
            ),
            "--max-num-seqs",
        ),
        Flag(
            _t(
                "vllm.max_num_batched_tokens",
                "int",
                8192,
                "vLLM: token budget of one scheduler step.",
                minimum=64,
                maximum=262144,
                log=True,
            ),
            "--max-num-batched-tokens",
        ),
        Flag(_t("vllm.block_size", "int", 16, "vLLM: tokens per KV-cache block.", choices=(8, 16, 32)), "--block-size"),
        Flag(
            _t("vllm.enable_prefix_caching", "bool", True, "vLLM: reuse KV blocks of shared prompt prefixes."),
            "--enable-prefix-caching",
            "--no-enable-prefix-caching",
        ),
        Flag(
            _t("vllm.enable_chunked_prefill", "bool", True, "vLLM: split long prefills across steps."),
            "--enable-chunked-prefill",
            "--no-enable-chunked-prefill",
        ),
        Flag(
            _t(
                "vllm.gpu_memory_utilization",
                "float",
                0.9,
                "vLLM: share of GPU memory for weights and KV cache.",
                minimum=0.05,
                maximum=0.99,
                searchable=False,
            ),
            "--gpu-memory-utilization",
        ),
        Flag(
            _t(
                "vllm.max_model_len",
                "int",
                0,
                "vLLM: longest sequence; 0 keeps the model's own.",
                minimum=0,
                maximum=10_000_000,
                searchable=False,
            ),
            "--max-model-len",
            omit=0,
        ),
    )

    def check(self) -> None:
        self.base_command(None)

    def base_command(self, server):
        binary = os.environ.get("TOKENOPS_VLLM_BIN")
        program = self.program(
            [binary or "vllm", "serve"],
            "TOKENOPS_VLLM_BIN" if binary else None,
            "install vLLM (pip install vllm), or set TOKENOPS_VLLM_BIN or --launcher-cmd",
        )
        model = self.model_arg()
        if server is None:
            return program
        return [*program, model, "--host", "127.0.0.1", "--port", str(server.port)]


class SGLangLauncher(CommandLineLauncher):
    """``python -m sglang.launch_server``; the Python is ``$TOKENOPS_SGLANG_PYTHON`` or this one."""

    name = "sglang"
    prefixes = ("sglang.",)
    flags = (
        Flag(
            _t(
                "sglang.max_running_requests",
                "int",
                256,
                "SGLang: most requests running at once.",
                minimum=1,
                maximum=4096,
                log=True,
            ),
            "--max-running-requests",
        ),
        Flag(
            _t(
                "sglang.chunked_prefill_size",
                "int",
                8192,
                "SGLang: most prompt tokens in one prefill chunk.",
                minimum=64,
                maximum=131072,
                log=True,
            ),
            "--chunked-prefill-size",
        ),
        Flag(
            _t(
                "sglang.max_prefill_tokens",
                "int",
                16384,
                "SGLang: prompt-token budget of one prefill batch.",
                minimum=256,
                maximum=262144,
                log=True,
            ),
            "--max-prefill-tokens",
        ),
        Flag(
            _t(
                "sglang.schedule_policy",
                "str",
                "fcfs",
                "SGLang: order of the waiting queue.",
                choices=("fcfs", "lpm", "random", "dfs-weight"),
            ),
            "--schedule-policy",
        ),
        Flag(
            _t(
                "sglang.schedule_conservativeness",
                "float",
                1.0,
                "SGLang: how much room admission keeps for future tokens (lower admits more).",
                minimum=0.3,
                maximum=1.5,
            ),
            "--schedule-conservativeness",
        ),
        Flag(
            _t("sglang.disable_radix_cache", "bool", False, "SGLang: turn off prefix reuse (RadixAttention)."),
            "--disable-radix-cache",
        ),
        Flag(
            _t(
                "sglang.mem_fraction_static",
                "float",
                0.85,
                "SGLang: share of GPU memory for weights and KV pool.",
                minimum=0.05,
                maximum=0.99,
                searchable=False,
            ),
            "--mem-fraction-static",
        ),
    )

    def check(self) -> None:
        self.base_command(None)

    def base_command(self, server):
        python = os.environ.get("TOKENOPS_SGLANG_PYTHON")
        hint = "install SGLang (pip install sglang), or set TOKENOPS_SGLANG_PYTHON or --launcher-cmd"
        if python is None and not self.options.command and importlib.util.find_spec("sglang") is None:
            raise TuneError(f"sglang: SGLang is not installed in {sys.executable}; {hint}")
        program = self.program(
            [python or sys.executable, "-m", "sglang.launch_server"], "TOKENOPS_SGLANG_PYTHON" if python else None, hint
        )
        model = self.model_arg()
        if server is None:
            return program
        return [*program, "--model-path", model, "--host", "127.0.0.1", "--port", str(server.port)]


@hookimpl
def tokenops_register_launchers(register):
    register("tokenops", TokenopsLauncher)
    register("vllm", VLLMLauncher)
    register("sglang", SGLangLauncher)


@hookimpl
def tokenops_register_tunables(register):
    for launcher in (VLLMLauncher, SGLangLauncher):
        for flag in launcher.flags:
            register(flag.tunable)
