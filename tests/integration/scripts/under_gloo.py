"""Run a training script unchanged with torch.distributed's default group already made over gloo.

``python under_gloo.py SCRIPT [ARGS...]`` (under torchrun): the reference run of a Gaudi
script whose library picks "hccl" itself (optimum-habana through accelerate): accelerate keeps
an existing default group, so the same script's collectives go through gloo instead.
"""

import gc
import runpy
import sys

import torch.distributed as dist

if __name__ == "__main__":
    dist.init_process_group("gloo")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
    # the script's DDP model first, then the group (NOTE [the group outlives DDP] in
    # models/train.py): a gloo group left to the interpreter's exit can end the rank with
    # "terminate called without an active exception" (SIGABRT), seen once in the suite
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
