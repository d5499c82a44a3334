"""Text generation as optimum-habana's ``examples/text-generation/run_generation.py`` runs it, on a
tiny random Llama (no download): ``adapt_transformers_to_gaudi``, the model built and moved to the
card, ``generate(..., lazy_mode=True, hpu_graphs=..., iteration_times=...)`` timed by optimum's
``HabanaGenerationTime``, warmed up twice before the timed run (the script's default warms up 3 times).

Prints one JSON line: ``init`` (a timer spanning ``--host-sleep`` wall seconds, the model's build
and its move to the card, as the script's "Model initialization"), then per pass the per-token
``iteration_times``, the end-to-end latency ``e2e`` and the generated ``tokens``. Passes:
``lazy`` (lazy mode, no HPU graphs), ``lazy_host_sleep`` (the same, with ``--host-sleep`` wall
seconds of host work before every forward, which the simulated card never sees), ``hpu_graphs``
(the model wrapped with ``wrap_in_hpu_graph``, as ``--use_hpu_graphs`` does).
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import habana_frameworks.torch.core as htcore  # noqa: F401 - the simulated Gaudi, as a Gaudi script imports it
import torch
from optimum.habana.transformers.modeling_utils import adapt_transformers_to_gaudi
from optimum.habana.utils import HabanaGenerationTime
from transformers import AutoModelForCausalLM, LlamaConfig

parser = argparse.ArgumentParser()
parser.add_argument("--host-sleep", type=float, default=0.05)
parser.add_argument("--new-tokens", type=int, default=5)
args = parser.parse_args()

adapt_transformers_to_gaudi()
init = HabanaGenerationTime()
init.start()
time.sleep(args.host_sleep)
torch.manual_seed(0)
config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=2)
model = AutoModelForCausalLM.from_config(config).eval().to("hpu")  # after adapting: optimum's Gaudi Llama
init.step()

gc = copy.deepcopy(model.generation_config)
gc.max_new_tokens, gc.use_cache, gc.static_shapes, gc.do_sample, gc.ignore_eos = args.new_tokens, True, True, False, True
input_ids = torch.randint(3, 256, (2, 8), generator=torch.Generator().manual_seed(1))


def generate(graphs: bool) -> dict:
    e2e = HabanaGenerationTime()
    e2e.start()
    iteration_times: list[float] = []
    with torch.no_grad():
        out = model.generate(input_ids=input_ids.to("hpu"), attention_mask=torch.ones_like(input_ids).to("hpu"),
                             generation_config=gc, lazy_mode=True, hpu_graphs=graphs, ignore_eos=True,
                             iteration_times=iteration_times).cpu()
    e2e.step()
    return {"iteration_times": iteration_times, "e2e": e2e.last_duration, "tokens": out.tolist()}


result = {"init": init.last_duration}
generate(False), generate(False)
result["lazy"] = generate(False)
hook = model.register_forward_pre_hook(lambda *_: time.sleep(args.host_sleep))
result["lazy_host_sleep"] = generate(False)
hook.remove()
from habana_frameworks.torch.hpu import wrap_in_hpu_graph  # noqa: E402 - as run_generation.py wraps it

model = wrap_in_hpu_graph(model)
generate(True), generate(True)
result["hpu_graphs"] = generate(True)
print(json.dumps(result))
