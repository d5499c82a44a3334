"""DDP features users rely on train over "hccl" (model on "hpu") exactly as over "gloo" (CPU).

Each feature runs the same seeded training (non-integer random data, different per rank,
several steps) twice in every rank: over the default "hccl" group with the model on
``"hpu"``, and over a "gloo" group with the model on the CPU; the final parameters must
agree. Features: ``no_sync()`` gradient accumulation, ``find_unused_parameters`` with a
branch some ranks skip on some steps, the fp16/bf16 compression hooks, PowerSGD (error
feedback and warm start, compressing from step 2), ``Join``/``model.join()`` with uneven
inputs, and ``static_graph`` / ``gradient_as_bucket_view`` combined with them.

NOTE [tolerance]
    Two ranks: every reduction is ``a + b`` of the same two operands, which IEEE addition
    gives bit for bit in either order, in float32 as in float16/bfloat16 (both backends
    round each sum once). The local math (forward, backward, PowerSGD's QR and matmuls)
    runs the same CPU kernels on the same values. So the parameters are expected to be
    identical; :data:`ATOL` = 0 makes any drift visible at once.

    Three ranks: ``a + b + c`` rounds twice and the order differs (gloo's ring adds each
    chunk in ring order, hccl in rank order), so a gradient may differ by one ulp of its
    precision: after 6 SGD steps (lr 0.05, momentum 0.9) the parameters (|p| < 0.5) differ by
    one float32 ulp, 1.5e-8 (:data:`ATOL3_FP32` = 1e-7 is about 3 ulp), and by 4e-6 with
    the fp16 hook, whose sums carry 11-bit mantissas (:data:`ATOL3_FP16` = 2e-5). The data
    is seeded, so these figures are deterministic, not noise.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.dist_utils import run_ranks

STEPS = 6
ATOL = 0.0  # see NOTE [tolerance]
ATOL3_FP32 = 1e-7
ATOL3_FP16 = 2e-5
THREE_RANKS = ["join", "model_join+bucket_view", "join+fp16_hook", "powersgd"]


class BranchNet(nn.Module):
    """An MLP with an optional branch and a parameter no step ever uses."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(24, 32)
        self.fc2 = nn.Linear(32, 32)
        self.head = nn.Linear(32, 8)
        self.branch = nn.Linear(32, 8)
        self.never = nn.Linear(4, 4)  # unused on every step and rank

    def forward(self, x: torch.Tensor, use_branch: bool = True) -> torch.Tensor:
        h = torch.relu(self.fc2(torch.relu(self.fc1(x))))
        out = self.head(h)
        if use_branch:
            out = out + self.branch(h)
        return out


# feature -> (loop, DDP keyword arguments, hook name or None)
#   loop "plain": one batch per step, branch always used except "never"
#   loop "branch": rank r skips the branch on steps where (step + r) % 3 == 0 (and on all
#       ranks at step 4)
#   loop "accumulate": one plain step, then steps of two micro-batches under no_sync() and
#       one synced micro-batch
#   loop "join" / "model_join": rank r has STEPS - 2 + 2 r batches, under Join([ddp]) /
#       ddp.join()
FEATURES: dict[str, tuple[str, dict, str | None]] = {
    "no_sync": ("accumulate", {"find_unused_parameters": True}, None),
    "no_sync+bucket_view": ("accumulate", {"find_unused_parameters": True, "gradient_as_bucket_view": True}, None),
    "no_sync+static_graph": ("accumulate", {"static_graph": True}, None),
    "find_unused": ("branch", {"find_unused_parameters": True}, None),
    "find_unused+bucket_view": ("branch", {"find_unused_parameters": True, "gradient_as_bucket_view": True}, None),
    "static_graph": ("plain", {"static_graph": True}, None),
    "static_graph+bucket_view": ("plain", {"static_graph": True, "gradient_as_bucket_view": True}, None),
    "fp16_hook": ("plain", {"find_unused_parameters": True}, "fp16"),
    "fp16_hook+static_graph+bucket_view": ("plain", {"static_graph": True, "gradient_as_bucket_view": True}, "fp16"),
    "bf16_hook": ("plain", {"find_unused_parameters": True}, "bf16"),
    "bf16_hook+bucket_view": ("branch", {"find_unused_parameters": True, "gradient_as_bucket_view": True}, "bf16"),
    "powersgd": ("plain", {}, "powersgd2"),
    "powersgd_rank4+bucket_view": ("plain", {"gradient_as_bucket_view": True}, "powersgd4"),
    "powersgd+static_graph": ("plain", {"static_graph": True}, "powersgd2"),
    "join": ("join", {"find_unused_parameters": True}, None),
    "model_join+bucket_view": ("model_join", {"find_unused_parameters": True, "gradient_as_bucket_view": True}, None),
    "join+fp16_hook": ("join", {"find_unused_parameters": True}, "fp16"),
}


def _bf16_compress(process_group, bucket):  # unannotated: DDP checks real annotations
    """``bf16_compress_hook`` under another name: DDP refuses that name unless CUDA with NCCL
    2.10+ or XPU is present (``DDP._check_comm_hook``), on "gloo" as on "hccl"; the hook
    itself is plain ``dist.all_reduce`` of a bfloat16 buffer, which both backends run."""
    return default_hooks.bf16_compress_hook(process_group, bucket)


def _register_hook(ddp: DDP, group, hook: str | None):
    """Register the named comm hook; returns the PowerSGD state (or None)."""
    if hook is None:
        return None
    if hook == "fp16":
        ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)
        return None
    if hook == "bf16":
        ddp.register_comm_hook(group, _bf16_compress)
        return None
    # PowerSGD: compress from step 2 (DDP's first step builds the buckets), with error
    # feedback and warm start; rank 4 orthogonalizes with QR, rank 2 with Gram-Schmidt
    state = powersgd.PowerSGDState(
        process_group=group, matrix_approximation_rank=int(hook[-1]), start_powerSGD_iter=2,
        min_compression_rate=1.5, use_error_feedback=True, warm_start=True, random_seed=7)
    ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    return state


def _train(feature: str, group, device: str, rank: int, world: int) -> dict:
    """Train BranchNet for the feature; returns final parameters and what the hook saw."""
    loop, kwargs, hook = FEATURES[feature]
    torch.manual_seed(0)
    model = BranchNet().to(device)
    if not (kwargs.get("find_unused_parameters") or kwargs.get("static_graph")):
        model.never.requires_grad_(False)  # DDP would wait for its gradient forever
    start = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
    ddp = DDP(model, process_group=group, **kwargs)
    state = _register_hook(ddp, group, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1000 + rank)  # each rank sees different data

    def batch():
        x = torch.randn(12, 24, generator=g).to(device)
        y = torch.randn(12, 8, generator=g).to(device)
        return x, y

    def mark_step() -> None:  # lazy mode's graph boundaries, as Gaudi scripts place them
        if device == "hpu":
            import hpu_runtime  # in the spawned rank only: it activates the bridge on import

            hpu_runtime.mark_step()

    def step(use_branch: bool = True) -> None:
        x, y = batch()
        loss = nn.functional.mse_loss(ddp(x, use_branch), y)
        loss.backward()
        mark_step()
        opt.step()
        mark_step()
        opt.zero_grad()

    if loop == "plain":
        for _ in range(STEPS):
            step()
    elif loop == "branch":
        for s in range(STEPS):
            step(use_branch=(s + rank) % 3 != 0 and s != 4)
    elif loop == "accumulate":
        step()  # static_graph records its graph on a synced first iteration (gloo fails too otherwise)
        for _ in range(STEPS // 2):
            with ddp.no_sync():
                for _ in range(2):
                    x, y = batch()
                    (nn.functional.mse_loss(ddp(x), y) / 3).backward()
            x, y = batch()
            (nn.functional.mse_loss(ddp(x), y) / 3).backward()
            mark_step()
            opt.step()
            mark_step()
            opt.zero_grad()
    elif loop in ("join", "model_join"):
        ctx = Join([ddp]) if loop == "join" else ddp.join()
        with ctx:
            for _ in range(STEPS - 2 + 2 * rank):  # 4, 6, 8, ... batches
                step()
    else:  # pragma: no cover
        raise ValueError(loop)
    params = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
    out = {"params": params, "moved": (params - start).abs().max().item()}
    if state is not None:
        out["powersgd_iter"] = state.iter
        out["error_dict"] = len(state.error_dict)
    return out


def _compare(rank: int, world: int, features: list[str]) -> dict:
    gloo = dist.new_group(backend="gloo")
    hccl = dist.group.WORLD
    out = {}
    for name in features:
        first = len(hccl.history)
        h = _train(name, hccl, "hpu", rank, world)
        c = _train(name, gloo, "cpu", rank, world)
        gathered = [torch.empty_like(h["params"]) for _ in range(world)]
        dist.all_gather(gathered, h["params"], group=gloo)
        records = hccl.history[first:]
        out[name] = {
            "diff": (h["params"] - c["params"]).abs().max().item(),
            "spread": max((t - h["params"]).abs().max().item() for t in gathered),
            "moved": h["moved"],
            "hccl": {k: v for k, v in h.items() if k != "params"},
            "gloo": {k: v for k, v in c.items() if k != "params"},
            "allreduce_bytes": sorted({r.nbytes for r in records if r.kind == "allreduce"}),
            "allreduces": sum(r.kind == "allreduce" for r in records),
        }
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    """Every feature, trained once per backend on 2 ranks."""
    return run_ranks(_compare, 2, list(FEATURES), timeout=240)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("feature", list(FEATURES))
def test_ddp_feature_matches_gloo(results, feature):
    """Final parameters over hccl on "hpu" equal gloo's on the CPU; ranks agree; training moved."""
    for rank, res in enumerate(results):
        r = res[feature]
        assert r["moved"] > 1e-3, f"{feature}: training did not change the parameters"
        assert r["diff"] <= ATOL, f"rank {rank} {feature}: hccl and gloo differ by {r['diff']}"
        assert r["spread"] == 0.0, f"rank {rank} {feature}: ranks disagree by {r['spread']}"
        assert r["hccl"] == r["gloo"], f"rank {rank} {feature}: hook state differs {r['hccl']} vs {r['gloo']}"
        assert r["allreduces"] > 0


@pytest.mark.timeout(300)
def test_hooks_reach_hccl_compressed(results):
    """hccl is handed what each hook sends: fp32 / half-size buckets, PowerSGD's P and Q."""
    numel = sum(p.numel() for p in BranchNet().parameters())  # 2404, one bucket
    used_map = 4 * 10  # find_unused_parameters: one int32 per parameter
    assert results[0]["find_unused"]["allreduce_bytes"] == [used_map, 4 * numel]
    for name in ("fp16_hook", "bf16_hook"):
        assert results[0][name]["allreduce_bytes"] == [used_map, 2 * numel]
    # PowerSGD rank 2 ("never" frozen): steps 0-1 allreduce the whole fp32 bucket; then the
    # 80 bias elements uncompressed, P = (32+32+8+8) x 2 and Q = (24+32+32+32) x 2 elements
    ps = results[0]["powersgd"]
    assert ps["allreduce_bytes"] == [4 * 80, 4 * 160, 4 * 240, 4 * (numel - 20)]
    assert ps["hccl"]["powersgd_iter"] == STEPS and ps["hccl"]["error_dict"] == 1


@pytest.mark.timeout(200)
def test_three_ranks_uneven_join_matches_gloo():
    """3 ranks (4, 6 and 8 batches under join): hccl equals gloo up to summation order."""
    results = run_ranks(_compare, 3, THREE_RANKS, timeout=180)
    for rank, res in enumerate(results):
        for name in THREE_RANKS:
            r = res[name]
            tol = ATOL3_FP16 if "fp16" in name else ATOL3_FP32
            assert r["moved"] > 1e-3, f"{name}: training did not change the parameters"
            assert r["diff"] <= tol, f"rank {rank} {name}: hccl and gloo differ by {r['diff']}"
            assert r["spread"] == 0.0, f"rank {rank} {name}: ranks disagree by {r['spread']}"
            assert r["hccl"].get("powersgd_iter") == r["gloo"].get("powersgd_iter")
