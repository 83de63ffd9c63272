"""The bundled engine's tunables."""

from tokenops import hookimpl
from tokenops.tunables import Tunable

TOKENOPS_LAYER = "compute_model"


@hookimpl
def tokenops_register_tunables(register):
    register(Tunable("engine.max_num_batched_tokens", "int", 512, "Token budget of one engine step (prefill chunks + decodes).",
                     live=True, minimum=16, maximum=65536, log=True))
    register(Tunable("engine.max_num_seqs", "int", 32, "Most sequences running in one batch.",
                     live=True, minimum=1, maximum=1024, log=True))
    register(Tunable("engine.enable_prefix_caching", "bool", True, "Reuse KV blocks of identical prompt prefixes.", live=True))
    register(Tunable("engine.schedule_policy", "str", "fcfs", "Order of the waiting queue.", live=True,
                     choices=("fcfs", "priority")))
    register(Tunable("engine.block_size", "int", 16, "Tokens per KV-cache block (restart).", minimum=1, maximum=256,
                     choices=(8, 16, 32, 64)))
    register(Tunable("engine.kv_cache_tokens", "int", 16384, "KV-cache budget in tokens, preallocated (restart).",
                     minimum=256, maximum=4_194_304, log=True))
    register(Tunable("engine.attention_backend", "str", "auto",
                     "Decode attention: compiled paged kernel (native), gather + SDPA (torch), or native when it "
                     "builds (auto) (restart).", choices=("auto", "native", "torch"), searchable=False))
    register(Tunable("engine.torch_threads", "int", 0, "torch intra-op threads; 0 keeps torch's default (restart).",
                     minimum=0, maximum=512, searchable=False))
