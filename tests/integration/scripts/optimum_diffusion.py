"""optimum-habana's ``GaudiStableDiffusionPipeline`` on the simulated Gaudi, as its text-to-image example
runs it (``use_habana=True``, ``use_hpu_graphs``, bf16 autocast from the GaudiConfig), on a tiny
random UNet, VAE and CLIP text encoder built from configs (nothing downloaded; the prompt is given
as embeddings). Generates the same images without and with HPU graphs (the pipeline caches its
UNet graphs itself with ``ht.hpu.graphs.input_hash`` / ``copy_to`` / ``CachedParams``), then twice
more with the graphs cached, the second time sleeping 0.05 wall seconds at every step; prints one
JSON line with each run's images' checksum, the graphs the pipeline cached and its throughput.
"""

from __future__ import annotations

import json
import time

import habana_frameworks.torch.core as htcore  # noqa: F401 - the simulated Gaudi, as a Gaudi script imports it
import numpy as np
import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from optimum.habana import GaudiConfig
from optimum.habana.diffusers import GaudiDDIMScheduler, GaudiStableDiffusionPipeline
from transformers import CLIPTextConfig, CLIPTextModel

torch.manual_seed(0)
unet = UNet2DConditionModel(block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4,
                            out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
                            norm_num_groups=8)
vae = AutoencoderKL(block_out_channels=(32,), in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",),
                    up_block_types=("UpDecoderBlock2D",), latent_channels=4, norm_num_groups=8)
text_encoder = CLIPTextModel(CLIPTextConfig(hidden_size=32, intermediate_size=37, num_attention_heads=4,
                                            num_hidden_layers=2, vocab_size=1000, max_position_embeddings=77))
scheduler = GaudiDDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                               set_alpha_to_one=False)
prompt = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1))


def pipeline(graphs: bool) -> GaudiStableDiffusionPipeline:
    return GaudiStableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=None, unet=unet,
                                        scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                        requires_safety_checker=False, use_habana=True, use_hpu_graphs=graphs,
                                        gaudi_config=GaudiConfig(use_torch_autocast=True))


def generate(pipe: GaudiStableDiffusionPipeline, host_sleep: float = 0.0) -> dict:
    out = pipe(prompt_embeds=prompt, negative_prompt_embeds=torch.zeros_like(prompt), num_inference_steps=5, height=16,
               width=16, output_type="np", batch_size=1, num_images_per_prompt=2,
               generator=torch.Generator().manual_seed(2), callback=lambda *_: time.sleep(host_sleep))
    images = np.asarray(out.images)
    return {"shape": list(images.shape), "sum": float(images.astype(np.float64).sum()),
            "cached_graphs": len(getattr(pipe, "cache", {})), "throughput": out.throughput}


result = {"plain": generate(pipeline(False))}
graphed = pipeline(True)
result["graphs"] = generate(graphed)  # captures
result["graphs_steady"] = generate(graphed)
result["graphs_steady_host_sleep"] = generate(graphed, host_sleep=0.05)  # wall time the card never sees
print(json.dumps(result))
