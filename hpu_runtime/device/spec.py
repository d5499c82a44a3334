"""Hardware constants of the simulated Gaudi devices, one frozen spec per generation.

Every number carries its unit in the field name and its source in a comment. Numbers from
public Intel material are marked with their source; the MME efficiency and tile are fitted
to published training throughput where the host is off the critical path (NOTE
[calibration]) and the host-side costs to Intel's published HPU-graphs measurement (NOTE
[host costs]); numbers that no public document gives (TPC and HBM efficiencies, compile
times) are marked "modelling assumption".

Sources used below:

* [HC24] Intel, "Intel Gaudi 3 AI Accelerator: Architected for Gen AI Training and
  Inference", Hot Chips 2024 (R. Kaplan). Generation table: peak BF16 60 / 432 / 1835
  TFLOP/s, HBM 32 / 96 / 128 GB, peak HBM bandwidth 0.9 TB/s / 2.46 TB/s / 3.67 TB/s, peak
  PCIe bandwidth 64 / 64 / 128 GB/s bidirectional; Gaudi 3: BF16 vector 28.7 TFLOP/s,
  8 MME, 64 TPC, PCIe Gen5 x16.
* [GS] Seed "Getting Started with Gaudi": first-generation Gaudi has 4 HBM stacks, 32 GB,
  1 TB/s; PCIe Gen3/Gen4 host interface.
* [DESIGN6] /work/shared/DESIGN.md section 6 (TPC / MME counts 8/1, 24/2, 64/8).
* [TPC] Intel Gaudi docs, TPC User Guide: 2048-bit SIMD, per cycle 64 fp32 lanes or 128
  16-bit lanes, so the vector fp32 rate is half the bf16 rate.
* [G3SPEC] Public Gaudi 3 spec listings derived from Intel's Gaudi 3 white paper: FP32
  matrix 229.38 TFLOP/s (1/8 of BF16), FP32 vector 14.35 TFLOP/s.
* [HPUG] Intel Gaudi documentation, PyTorch user guide, "HPU Graphs for Training":
  host time per training step of an MNIST network with and without HPU graphs.
* [MAMF] S. Bekman, ml-engineering "maximum achievable matmul FLOPS" table: Gaudi 2
  reaches ~99% of peak BF16 on large square matmuls; end-to-end LLM training reports
  (Databricks, MPT-7B on Gaudi 2: ~260 of 432 TFLOP/s) are nearer 60%.
* [MLPERF] MLCommons training results v1.1, v3.0, v3.1, Intel-HabanaLabs (result logs,
  launch scripts, systems/*.json): the figures NOTE [calibration] fits to, listed with
  their arithmetic in models/published_figures.toml.

HBM capacities use binary units (GiB): HBM stacks are built from power-of-two dies, and the
marketing "32 GB" is 4 stacks x 8 GiB.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["DeviceSpec", "DEVICE_SPECS", "get_device_spec"]

logger = logging.getLogger(__name__)

_GIB = 1 << 30
_TERA = 1e12
_GIGA = 1e9


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceSpec:
    """Constants of one simulated Gaudi card.

    Rates are peak (data-sheet) rates; the ``*_efficiency`` fields give the achievable
    fraction the cost model applies. Times are integer nanoseconds of simulated time, not
    measured time.

    Raises:
        ValueError: from ``__post_init__`` if a field is missing a sensible value (empty
            name, non-positive rate or count, efficiency outside (0, 1], negative time,
            or an fp32 rate above the matching bf16 rate).
    """

    name: str
    """Generation name: "gaudi", "gaudi2" or "gaudi3" (free text for custom specs)."""
    hbm_bytes: int
    """HBM capacity in bytes."""
    hbm_bytes_per_s: float
    """Peak HBM bandwidth in bytes per second."""
    mme_bf16_flops_per_s: float
    """Peak dense matmul rate of all MMEs together in bf16, FLOP/s."""
    mme_fp32_flops_per_s: float
    """Peak dense matmul rate of all MMEs together in fp32, FLOP/s."""
    tpc_bf16_flops_per_s: float
    """Peak vector rate of all TPCs together in bf16, FLOP/s."""
    tpc_fp32_flops_per_s: float
    """Peak vector rate of all TPCs together in fp32, FLOP/s."""
    mme_efficiency: float
    """Achievable fraction of the MME peak, in (0, 1]."""
    tpc_efficiency: float
    """Achievable fraction of the TPC peak, in (0, 1]."""
    hbm_efficiency: float
    """Achievable fraction of the HBM peak bandwidth, in (0, 1]."""
    pcie_bytes_per_s: float
    """Host<->device copy bandwidth in one direction, bytes per second."""
    host_op_ns: int
    """Lazy mode: host time to accumulate one op into the pending graph, ns."""
    eager_op_launch_ns: int
    """Eager mode: host time to launch one op, ns."""
    graph_launch_ns: int
    """Time to launch a compiled recipe on the device, ns."""
    compile_base_ns: int
    """Fixed part of a simulated graph compile, ns (compile = base + per_op x n_ops)."""
    compile_per_op_ns: int
    """Per-op part of a simulated graph compile, ns."""
    num_tpc: int
    """Number of TPC (vector) cores."""
    num_mme: int
    """Number of MME (matrix) engines."""
    mme_tile: int = 1
    """Side of the MME's output tile in elements: a matrix product narrower than this in an
    output dimension uses that fraction of the MME (NOTE [MME shape efficiency] in
    :mod:`hpu_runtime.device.cost_model`; see NOTE [calibration])."""
    op_overhead_ns: int = 0
    """Fixed device time of every op of a launched graph on its engine, on top of its roofline
    time, simulated ns: the setup of each node the graph runs (NOTE [calibration])."""
    graph_replay_ns: int = 10_000
    """HPU graph replay: host time to check input shapes and launch a captured graph, ns
    (replaces the per-op accumulation of lazy mode; see NOTE [host costs])."""
    h2d_copy_ns: int = 0
    """Fixed host time of one host->device copy (``.to("hpu")``), ns, on top of its PCIe bytes."""
    host_read_ns: int = 0
    """Fixed host time of one host read of a device tensor (``.item()``, ``.cpu()``), ns,
    on top of the wait for the device and the PCIe bytes."""
    host_flops_per_s: float = 50 * _GIGA
    """CPU-fallback ops: host compute rate, FLOP/s (modelling assumption: a few AVX cores)."""
    host_bytes_per_s: float = 10 * _GIGA
    """CPU-fallback ops: host memory bandwidth seen by one op, bytes/s (modelling assumption)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"DeviceSpec.name must be a non-empty string, got {self.name!r}")
        for field in ("hbm_bytes", "host_op_ns", "eager_op_launch_ns", "graph_launch_ns",
                      "compile_base_ns", "compile_per_op_ns", "num_tpc", "num_mme",
                      "graph_replay_ns", "h2d_copy_ns", "host_read_ns", "mme_tile", "op_overhead_ns"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(
                    f"DeviceSpec({self.name}).{field} must be an int, got {value!r}")
        for field in ("hbm_bytes", "num_tpc", "num_mme", "mme_tile"):
            if getattr(self, field) <= 0:
                raise ValueError(
                    f"DeviceSpec({self.name}).{field} must be > 0, got {getattr(self, field)}")
        for field in ("host_op_ns", "eager_op_launch_ns", "graph_launch_ns",
                      "compile_base_ns", "compile_per_op_ns", "graph_replay_ns", "h2d_copy_ns",
                      "host_read_ns", "op_overhead_ns"):
            if getattr(self, field) < 0:
                raise ValueError(
                    f"DeviceSpec({self.name}).{field} is a time in ns and must be >= 0, "
                    f"got {getattr(self, field)}")
        for field in ("hbm_bytes_per_s", "mme_bf16_flops_per_s", "mme_fp32_flops_per_s",
                      "tpc_bf16_flops_per_s", "tpc_fp32_flops_per_s", "pcie_bytes_per_s",
                      "host_flops_per_s", "host_bytes_per_s"):
            value = getattr(self, field)
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or not value > 0 or value == float("inf")):
                raise ValueError(
                    f"DeviceSpec({self.name}).{field} must be a finite rate > 0, got {value!r}")
        for field in ("mme_efficiency", "tpc_efficiency", "hbm_efficiency"):
            value = getattr(self, field)
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or not 0.0 < value <= 1.0):
                raise ValueError(
                    f"DeviceSpec({self.name}).{field} is a fraction of peak and must be in "
                    f"(0, 1], got {value!r}")
        if self.mme_fp32_flops_per_s > self.mme_bf16_flops_per_s:
            raise ValueError(
                f"DeviceSpec({self.name}): mme_fp32_flops_per_s ({self.mme_fp32_flops_per_s:g}) "
                f"exceeds mme_bf16_flops_per_s ({self.mme_bf16_flops_per_s:g})")
        if self.tpc_fp32_flops_per_s > self.tpc_bf16_flops_per_s:
            raise ValueError(
                f"DeviceSpec({self.name}): tpc_fp32_flops_per_s ({self.tpc_fp32_flops_per_s:g}) "
                f"exceeds tpc_bf16_flops_per_s ({self.tpc_bf16_flops_per_s:g})")


# NOTE [TPC rates of Gaudi and Gaudi 2]: Intel publishes the aggregate vector rate only for
# Gaudi 3 (28.7 TFLOP/s bf16 over 64 TPCs, [HC24]), i.e. ~0.448 TFLOP/s per TPC. For the
# older generations we assume the same per-TPC rate times the TPC count (modelling
# assumption); fp32 is half of bf16 in every generation ([TPC]: 64 fp32 vs 128 16-bit lanes).
_TPC_BF16_PER_CORE_FLOPS_PER_S = 28.7 * _TERA / 64  # [HC24] / [DESIGN6]
# NOTE [MME fp32 rate]: [G3SPEC] lists Gaudi 3 fp32 matmul at 1/8 of bf16. We apply the same
# ratio to Gaudi and Gaudi 2 (modelling assumption; no public fp32 MME figure found).
_MME_FP32_OVER_BF16 = 1.0 / 8.0

# Modelling assumptions every generation shares (no public source).
_TPC_EFFICIENCY = 0.70   # assumption: vector kernels rarely reach peak
_HBM_EFFICIENCY = 0.85   # assumption: typical achievable fraction of HBM peak
_COMPILE_BASE_NS = 150_000_000   # assumption: graph compile fixed cost, 150 ms
_COMPILE_PER_OP_NS = 2_000_000   # assumption: 2 ms per op in the graph

_MODEL_ASSUMPTIONS = dict(
    tpc_efficiency=_TPC_EFFICIENCY,
    hbm_efficiency=_HBM_EFFICIENCY,
    compile_base_ns=_COMPILE_BASE_NS,
    compile_per_op_ns=_COMPILE_PER_OP_NS,
)

# NOTE [calibration]
# The device model is grounded on published training throughput of runs whose host is off
# the critical path: Habana's MLPerf BERT on Gaudi2 (PyTorch, the step captured in one HPU
# graph) and TensorFlow graph-mode runs (MLPerf ResNet-50 and BERT; mlcommons
# training_results_v1.1 / v3.0 / v3.1, Intel-HabanaLabs), each planned in its own mode with
# its own micro-batch, packing, optimizer and all-reduce (models/published_runs.py, ROWS;
# `python -m models.bench_fidelity --refit` repeats the fit). Five constants are fitted,
# each on one figure, jointly (bisection, three rounds from the current values):
#   mme_efficiency, Gaudi 2:  0.81 on BERT-Large phase 2, 8 Gaudi2, MLPerf v3.0 PyTorch
#                             (HPU graph; 357 seq/s per card): the MME-bound model;
#   mme_tile, Gaudi 2:        198 on ResNet-50, 8 Gaudi2, MLPerf v3.1 TensorFlow (5,978 img/s
#                             per card): its early layers' 64- and 128-channel convolutions
#                             leave a large MME idle (NOTE [MME shape efficiency] in
#                             cost_model), so Gaudi2 runs ResNet-50 at a third of its peak;
#   mme_efficiency, Gaudi:    0.81 on BERT-Large phase 2, 8 first-gen cards, MLPerf v1.1
#                             TensorFlow (68.8 seq/s per card);
#   mme_tile, Gaudi:          1 (no shape penalty): fitted on ResNet-50, 8 first-gen cards,
#                             MLPerf v1.1 TensorFlow (1,680 img/s per card), the fit stops at
#                             its floor with that row still 5% slow;
#   op_overhead_ns, Gaudi:    16,700 ns per graph op, on ResNet-50, 256 first-gen cards at 64
#                             per card, MLPerf v1.1 TensorFlow (1,272 img/s per card). The same
#                             release and system ran 256, 128 and 64 images per card (8, 64 and
#                             256 cards; HLS-1H): its steps (152.4, 83.4, 50.3 ms) lie on one
#                             line of about 15 ms per step plus 0.53 ms per image, a fixed
#                             cost per step that no batch-proportional cost gives. It is taken
#                             as a fixed device time per op of a graph (the setup of each node
#                             on its engine); 844 graph ops per ResNet-50 step then hold about
#                             14 ms, and the 64-card row at 128 per card is a prediction.
#                             Gaudi 2 and Gaudi 3 keep 0: no published series of theirs runs
#                             one system and release at several batch sizes.
# Every other published row is a prediction, its residual printed by the benchmark (lazy
# mode without HPU graphs among them: its host costs come from the seed, NOTE [host costs]).
# Gaudi 3 takes Gaudi 2's fitted values (no training figure of its own here).
_GAUDI_FIT = dict(mme_efficiency=0.81, mme_tile=1, op_overhead_ns=16_700)
_GAUDI2_FIT = dict(mme_efficiency=0.81, mme_tile=198)

# NOTE [host costs]
# [HPUG] Intel Gaudi documentation, "HPU Graphs for Training" (PyTorch user guide): host time
# per step of its two-layer MNIST Net (batch 200, Adadelta, lazy mode, first-gen Gaudi):
# 4.8 ms without HPU graphs, about 3.9 ms with make_graphed_callables, about 1.3 ms with
# capture and replay. The bridge here charges those three steps 63 / 47 / 2 accumulated ops,
# 2 / 2 / 1 graph launches, 0 / 2 / 1 replays, 2 host->device copies each and 0.02 ms of PCIe
# bytes (`python -m models.bench_fidelity --refit` counts them and solves again). Taking a
# replay to cost what a launch costs (both enqueue a compiled recipe; the documentation says
# a replay only checks input shapes), the three figures fix the host costs exactly:
#   4.8 = 63 op + 2 launch + 2 copy;  3.9 = 47 op + 2 launch + 2 replay + 2 copy;
#   1.3 = 2 op + launch + replay + 2 copy   =>   op 57.4 us, launch = replay 9 us, copy 573 us.
# The per-copy cost also carries what else the seed's loop does once per step (Python, the
# data loader's batch): the documentation does not split it. A host read (.item(), .cpu())
# is a synchronous transfer the other way; no figure isolates it: charged like a copy
# (modelling assumption). An eager op is one accumulated op launched as its own graph.
# No public figure gives the host cost per op on Gaudi 2 or Gaudi 3 hosts: every generation
# takes these (an earlier version divided the Gaudi 2 per-op cost by a factor tuned to one
# throughput figure; no source gave it, and lazy mode is now a prediction, not a fit).
def _host_costs(op_ns: int, launch_ns: int, copy_ns: int) -> dict:
    return dict(host_op_ns=op_ns, graph_launch_ns=launch_ns, graph_replay_ns=launch_ns,
                eager_op_launch_ns=op_ns + launch_ns, h2d_copy_ns=copy_ns, host_read_ns=copy_ns)


_HOST = _host_costs(57_400, 9_000, 573_000)  # [HPUG] fit, see NOTE [host costs]

GAUDI = DeviceSpec(
    name="gaudi",
    hbm_bytes=32 * _GIB,                    # [GS], [HC24]: 32 GB (4 HBM2 stacks)
    hbm_bytes_per_s=1.0 * _TERA,            # [GS]: 1 TB/s ([HC24] gives 0.9 TB/s peak)
    mme_bf16_flops_per_s=60 * _TERA,        # [HC24]: peak BF16 60 TFLOP/s
    mme_fp32_flops_per_s=60 * _TERA * _MME_FP32_OVER_BF16,   # assumption, see NOTE
    tpc_bf16_flops_per_s=8 * _TPC_BF16_PER_CORE_FLOPS_PER_S,  # assumption, see NOTE
    tpc_fp32_flops_per_s=8 * _TPC_BF16_PER_CORE_FLOPS_PER_S / 2,  # [TPC] half of bf16
    pcie_bytes_per_s=32 * _GIGA,            # [HC24]: 64 GB/s bidirectional (PCIe Gen4 x16)
    **_MODEL_ASSUMPTIONS,
    **_GAUDI_FIT,
    **_HOST,
    num_tpc=8,                              # [DESIGN6]
    num_mme=1,                              # [DESIGN6]
)

GAUDI2 = DeviceSpec(
    name="gaudi2",
    hbm_bytes=96 * _GIB,                    # [HC24]: 96 GB (6 HBM2E stacks)
    hbm_bytes_per_s=2.46 * _TERA,           # [HC24]: 2.46 TB/s
    mme_bf16_flops_per_s=432 * _TERA,       # [HC24]: peak BF16 432 TFLOP/s
    mme_fp32_flops_per_s=432 * _TERA * _MME_FP32_OVER_BF16,  # assumption, see NOTE
    tpc_bf16_flops_per_s=24 * _TPC_BF16_PER_CORE_FLOPS_PER_S,  # assumption, see NOTE
    tpc_fp32_flops_per_s=24 * _TPC_BF16_PER_CORE_FLOPS_PER_S / 2,  # [TPC] half of bf16
    pcie_bytes_per_s=32 * _GIGA,            # [HC24]: 64 GB/s bidirectional (PCIe Gen4 x16)
    **_MODEL_ASSUMPTIONS,
    **_GAUDI2_FIT,
    **_HOST,
    num_tpc=24,                             # [DESIGN6]
    num_mme=2,                              # [DESIGN6]
)

GAUDI3 = DeviceSpec(
    name="gaudi3",
    hbm_bytes=128 * _GIB,                   # [HC24]: 128 GB (8 HBM2E stacks)
    hbm_bytes_per_s=3.67 * _TERA,           # [HC24]: 3.67 TB/s
    mme_bf16_flops_per_s=1835 * _TERA,      # [HC24]: BF16 matrix 1835 TFLOP/s
    mme_fp32_flops_per_s=1835 * _TERA * _MME_FP32_OVER_BF16,  # [G3SPEC]: 229.38 TFLOP/s
    tpc_bf16_flops_per_s=28.7 * _TERA,      # [HC24]: BF16 vector 28.7 TFLOP/s
    tpc_fp32_flops_per_s=28.7 * _TERA / 2,  # [G3SPEC]: 14.35 TFLOP/s; [TPC]
    pcie_bytes_per_s=64 * _GIGA,            # [HC24]: PCIe Gen5 x16, 128 GB/s bidirectional
    **_MODEL_ASSUMPTIONS,
    **_GAUDI2_FIT,
    **_HOST,
    num_tpc=64,                             # [HC24], [DESIGN6]
    num_mme=8,                              # [HC24], [DESIGN6]
)

DEVICE_SPECS: Mapping[str, DeviceSpec] = types.MappingProxyType(
    {spec.name: spec for spec in (GAUDI, GAUDI2, GAUDI3)})
"""Read-only map from canonical generation name to its spec."""

# Server names used in the Gaudi docs (HLS-1, HLS-Gaudi2/HLS-2, HLS-3) map to the card.
_ALIASES: Mapping[str, str] = types.MappingProxyType({
    "gaudi": "gaudi", "gaudi1": "gaudi", "hls1": "gaudi", "hls-1": "gaudi", "hls1h": "gaudi", "hls-1h": "gaudi",
    "dl1": "gaudi",
    "gaudi2": "gaudi2", "hls2": "gaudi2", "hls-2": "gaudi2", "hls-gaudi2": "gaudi2",
    "gaudi3": "gaudi3", "hls3": "gaudi3", "hls-3": "gaudi3",
})


def get_device_spec(name: str) -> DeviceSpec:
    """Return the spec of a Gaudi generation.

    Args:
        name: "gaudi", "gaudi2", "gaudi3" or a server name "hls1", "hls2", "hls3", "hls1h",
            "dl1" (the built-in topologies; case-insensitive; "gaudi1" and hyphenated "hls-1"
            forms are accepted too).

    Returns:
        The shared, frozen ``DeviceSpec``. Use ``dataclasses.replace`` to vary a field.

    Raises:
        ValueError: if the name is not a known generation; the message lists valid names.
    """
    key = name.strip().lower() if isinstance(name, str) else None
    canonical = _ALIASES.get(key) if key is not None else None
    if canonical is None:
        raise ValueError(
            f"unknown Gaudi device {name!r}; valid names: gaudi, gaudi2, gaudi3 "
            f"(or the servers hls1, hls2, hls3, hls1h, dl1)")
    return DEVICE_SPECS[canonical]

