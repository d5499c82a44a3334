"""``habana_frameworks.torch``: importing it starts the simulated Gaudi (``import habana_frameworks.torch as ht``).

As on Gaudi, the import registers the ``"hpu"`` device and ``torch.hpu`` and loads ``core``,
``hpu`` (``ht.hpu.memory``, ``ht.hpu.ModuleCacher``...) and ``distributed.hccl`` (which maps an
MPI launcher's rank variables to torch's, see its ``initialize_distributed_hpu``). The simulated device is
:mod:`hpu_runtime`'s: one card per process, lazy mode unless ``PT_HPU_LAZY_MODE=0``.

Status of every ``habana_frameworks`` name (verified against the imports of Habana's
Model-References hello_world ``mnist.py``, ResNet-50 ``train.py``/``utils.py``, BERT
``run_pretraining.py``/``run_squad.py``, optimum-habana's ``GaudiTrainer`` and
lightning-habana 1.6; "same" = behaves as Gaudi's, with simulated time):

====================================================  =========================================================
name                                                  status here
====================================================  =========================================================
``torch.core.mark_step(device_str="", sync=False)``    same: launches the lazy graph
``torch.core.is_lazy()``                              same (``PT_HPU_LAZY_MODE`` != ``0``)
``torch.core.add_step_closure``, ``iter_mark_step``,  same: closures run after the next ``mark_step`` or
``step_closure``                                      ``iter_mark_step`` (lazy mode only, as Gaudi's)
``torch.core.hpu_set_inference_env(model)``,          same: returns the model with conv+bn pairs folded
``hpu_set_env(model)``                                (eval mode, on the CPU, fx-traceable; else unchanged)
``torch.core.hpu_inference_initialize``,              accepted; what they set (constant parameters, fp8,
``hpu_initialize``, ``hpu_teardown_inference_env``,   graph-compiler flags) is not modelled
``hpu_reset_env``
``torch.hpu`` and ``habana_frameworks.torch.hpu``      the same names (one module's ``__all__``)
``torch.hpu.is_available/device_count/current_device  same: one simulated card per process, ``hpu:0``;
/set_device/get_device_name/synchronize``              ``device_count()`` counts the server's 8 cards as
                                                      Gaudi's does (``HABANA_VISIBLE_MODULES`` narrows it)
``torch.hpu.device(idx)``, ``device_of(t)``            context managers; index 0 only (one card per process)
``torch.load(..., map_location="hpu")``               hpu tensors over the loaded storages, one host->device
                                                      copy each (NOTE [loading onto the card])
``torch.hpu.enable/disable_dynamic_shape``,           recorded; shapes are always dynamic here (every new
``get_dynamic_shape_status``                          shape is a new graph key, as on Gaudi)
``torch.hpu.is_bf16_supported``, autocast dtypes      same
``torch.hpu.memory`` (``memory_stats``,               same keys (``Limit``, ``InUse``, ``MaxInUse``...), from
``memory_allocated``, ``max_memory_allocated``,       the simulated HBM
``reset_peak_memory_stats``, ``mem_get_info``,
``reset_accumulated_memory_stats``,
``memory_summary``, ``memory_reserved`` (= ``Limit``,
as Gaudi's), ``memory_cached`` (deprecated))
``torch.hpu.init``, ``get_device_properties``,        same; the properties string holds the spec's name, HBM
``get_arch_list``, ``memory_usage``,                  bytes, TPC and MME counts; ``setDeterministic`` calls
``setDeterministic``                                  ``torch.use_deterministic_algorithms`` (as Gaudi advises)
``torch.hpu.random`` (``manual_seed[_all]``,          same API; the HPU generator is the host generator
``seed[_all]``, ``initial_seed``, ``get/set_rng_      (tensors live on the host)
state[_all]``)
``torch.hpu.metrics`` (``metric_global``,             same names (``graph_compilation``, ``cpu_fallback``,
``metric_localcontext``, ``metrics_dump``)            ``recipe_cache``, ``memory_defragmentation``)
``torch.hpu.graphs`` (``HPUGraph``, ``graph``,        same (see :mod:`hpu_runtime.bridge.hpu_graphs`); the model gains
``ModuleCacher``, ``wrap_in_hpu_graph``,              ``set_iteration_count``/``capture_start``/``capture_end``
``make_graphed_callables``, ``input_hash``,           and ``clear_cache`` (same); ``clear_inputs`` is
``copy_to``, ``CachedParams``)                        accepted and releases nothing (graphs keep their inputs)
``torch.hpu.Stream/Event/stream``                     same (one simulated compute queue); a Stream is a
                                                      ``torch.Stream`` (``record_stream`` takes it)
``torch.distributed.hccl`` (import;                   same: maps OMPI/PMI variables, registers "hccl";
``initialize_distributed_hpu``)                       returns ``(world_size, rank, local_rank)``
``torch.utils.library_loader.load_habana_module``,    same (nothing to load; the emulator is always there)
``is_habana_available``
``torch.utils.experimental._get_device_type``,        same values: Gaudi 2, Gaudi2 4, Gaudi3 5 (from
``synDeviceType``                                     ``HPU_DEVICE_SPEC``)
``torch.utils.internal.is_lazy``, ``lazy_only``       same (DeepSpeed's HPU fused Adam imports them)
``torch.utils.debug``: ``_is_enabled_synapse_layout_   same values (True, False); the fallback count is the
handling``, ``_is_enabled_weight_permute_pass``,      ``cpu_fallback`` metric's; the other private debug
``_get_fallback_op_count``                            helpers are not emulated
``torch.hpex.optimizers.FusedSGD``, ``FusedLars``,    same numerics, one fused kernel each (:mod:`hpu_runtime.api.hpex`)
``FusedResourceApplyMomentum``, ``FusedLamb``,
``FusedAdamW``
``torch.hpex.normalization.FusedClipNorm``            same numerics, one fused kernel
``torch.hpex.movingavrg.FusedEMA``                    same numerics on floating-point entries, one fused kernel
``torch.dynamo.compile_backend.experimental.          accepted and recorded; backward stays eager autograd
enable_compiled_autograd``                            (charged op by op) and torch's C++ reducer
``torch.hpex.kernels`` (``FusedSDPA``,                same signatures, the unfused PyTorch reference's numerics, one
``RotaryPosEmbeddingHelperV1/V2/V3``,                 fused kernel forward and one backward (``torch.ops.hpu`` custom
``RotaryPosEmbeddingMode``, ``apply_rotary_pos_emb``, ops, :mod:`hpu_runtime.api.hpu_ops`); ``FusedSDPA``'s
``CTCLoss``, ``Fp8Ops.cast_to_fp8_v2``/                ``valid_seq_len``/``window_size``/``sink`` and other kernels
``cast_from_fp8``), ``hpex.normalization.             (``CustomNms``, ``fp8_fused_sdpa``...) raise naming them
FusedRMSNorm``
``torch.ops.hpu.rotary_pos_embedding[_backward]``,     same (see above); ``fp8_gemm_v2``, ``cast_to_fp8_just_in_time``,
``softmax_fp8``, ``mixture_of_experts``               ``convert_from_uint4`` raise ``NotImplementedError`` naming them
``torch.ops.hpu.optimizer_adamw`` (DeepSpeed's HPU     same numerics (Intel's form), one fused kernel; its lazy-
``FusedAdam``)                                        and eager-mode schemas are two overloads
``torch.hpu.sdp_kernel``, ``recompute_sdp_enabled``,  same (the recompute flag changes neither values nor cost);
``is_autocast_hpu_enabled``, ``get_autocast_hpu_      the innermost ``torch.autocast("hpu")`` region
dtype``
``torch.core.hpu``                                    the ``torch.hpu`` module, as Gaudi's ``htcore.hpu``
``PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST``,         honoured: replace autocast's default lists
``PT_HPU_AUTOCAST_FP32_OPS_LIST``
``torch.hpex.experimental.transformer_engine``        ``Linear``/``fp8_autocast``/``recipe`` accepted; layers compute
                                                      in their own dtype; ``fp8.is_fp8_available()`` is False;
                                                      ``FusedAttention`` is ``FusedSDPA``; ``distributed.
                                                      activation_checkpointing`` a no-op context
``mediapipe``, top-level ``habana_dataloader``        import-only placeholders (lightning-habana and ResNet-50
                                                      import them); building a media pipeline raises
                                                      ``NotImplementedError`` and ResNet-50 falls back to
                                                      torch's DataLoader as on a machine without them;
                                                      ``HabanaDataLoader`` is its host fallback, torch's
                                                      DataLoader
``torch.gpu_migration``, ``PT_HPU_GPU_MIGRATION=1``   same: a CUDA script runs on the card over "hccl"; the
                                                      variable works at ``import torch`` too (see
                                                      :mod:`hpu_runtime.api.gpu_migration` for what is mapped)
====================================================  =========================================================
"""

import hpu_runtime as _hpu_runtime  # noqa: F401 - starts the bridge, registers "hpu" and torch.hpu

# as Gaudi's package does: ``distributed.hccl`` maps an MPI launcher's variables to RANK,
# WORLD_SIZE and LOCAL_RANK at import, which accelerate (optimum-habana's GaudiTrainer under
# ``gaudi_spawn.py --use_mpi``) reads before anything else to choose hpu and "hccl"
from . import core, hpu  # noqa: E402,F401
from .distributed import hccl as _hccl  # noqa: E402,F401

# PT_HPU_GPU_MIGRATION=1: Intel's GPU Migration Toolkit, on before the script's first CUDA call
from hpu_runtime.api import gpu_migration as _gpu_migration  # noqa: E402

if _gpu_migration.requested():
    _gpu_migration.enable()
