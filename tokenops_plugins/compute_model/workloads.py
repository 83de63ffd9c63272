"""Built-in benchmark workloads for ``tokenops bench`` and ``tokenops tune``."""

from tokenops import hookimpl
from tokenops.bench import filedata, replay, sharegpt, synthetic

TOKENOPS_LAYER = "compute_model"


@hookimpl
def tokenops_register_workloads(register):
    register("synthetic", synthetic.synthetic)
    register("shared-prefix", synthetic.shared_prefix)
    register("sharegpt", sharegpt.sharegpt)
    register("sharegpt-multiturn", sharegpt.sharegpt_multiturn)
    register("replay", replay.replay)
    register("file", filedata.file_workload)
