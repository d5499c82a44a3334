"""The habana_frameworks names: the import mechanism (before/after torch, never shadowing a
real install) and every name the status table claims, exercised once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _py(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT") and not k.startswith(("OMPI_", "PMI_"))}
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd="/", env=full, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.timeout(120)
def test_import_before_torch_and_startup_stays_light() -> None:
    """The start-up hook is installed in every interpreter but imports neither torch nor
    hpu_runtime; ``import habana_frameworks.torch.core`` then works as a script's first line."""
    proc = _py("""
        import sys
        assert "torch" not in sys.modules and "hpu_runtime" not in sys.modules, sorted(sys.modules)
        import habana_frameworks.torch.core as htcore
        import torch
        x = torch.ones(3, device="hpu") * 2
        htcore.mark_step()
        print(x.device.type, torch.hpu.is_available(), htcore.__file__)
    """)
    assert proc.returncode == 0, proc.stderr
    dev, avail, where = proc.stdout.split()
    assert avail == "True" and Path(where).is_relative_to(REPO / "hpu_runtime" / "api" / "habana_frameworks")


@pytest.mark.timeout(120)
def test_import_after_torch_and_torchvision() -> None:
    """Gaudi scripts import torch and torchvision first (torchvision's compiled ops cannot load
    with the CPU torch wheel here; the hook makes the import work, nms included)."""
    proc = _py("""
        import torch, torchvision
        from torchvision import datasets, transforms, models
        import habana_frameworks.torch as ht
        keep = torchvision.ops.nms(torch.tensor([[0, 0, 2, 2.], [0, 0, 2, 2.1], [5, 5, 6, 6.]]),
                                   torch.tensor([0.9, 0.8, 0.7]), 0.5)
        print(keep.tolist(), ht.hpu.memory.memory_stats()["Limit"] > 0)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[0,", "2]", "True"]


@pytest.mark.timeout(120)
def test_a_real_installation_wins_and_ours_says_so_once(tmp_path: Path) -> None:
    fake = tmp_path / "habana_frameworks"
    (fake / "torch").mkdir(parents=True)
    (fake / "__init__.py").write_text("REAL = True\n")
    (fake / "torch" / "__init__.py").write_text("REAL_TORCH = True\n")
    proc = _py("""
        import warnings
        warnings.simplefilter("always")
        import habana_frameworks.torch as ht
        assert getattr(ht, "REAL_TORCH", False), ht.__file__
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            import hpu_runtime
            from hpu_runtime import import_hooks
            import_hooks.warn_if_shadowed()
        msgs = [str(w.message) for w in seen if "step aside" in str(w.message)]
        print(len(msgs), ht.__file__)
    """, env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"})
    assert proc.returncode == 0, proc.stderr
    count, where = proc.stdout.split()
    assert count == "1" and where.startswith(str(tmp_path))


@pytest.mark.timeout(60)
def test_switch_turns_the_names_off() -> None:
    proc = _py("import habana_frameworks", env={"HPU_EMULATOR_HABANA_FRAMEWORKS": "0"})
    assert proc.returncode != 0 and "No module named 'habana_frameworks'" in proc.stderr


@pytest.mark.timeout(120)
def test_hccl_import_maps_mpi_env_and_initialize_distributed_hpu() -> None:
    proc = _py("""
        import os
        from habana_frameworks.torch.distributed.hccl import initialize_distributed_hpu
        import torch.distributed as dist
        print(initialize_distributed_hpu(), os.environ["RANK"], os.environ["WORLD_SIZE"],
              os.environ["LOCAL_RANK"], "hccl" in dist.Backend.backend_list)
    """, env={"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["(4,", "1,", "1)", "1", "4", "1", "True"]
    partial = _py("from habana_frameworks.torch.distributed.hccl import initialize_distributed_hpu as f; print(f())",
                  env={"WORLD_SIZE": "2", "LOCAL_RANK": "1"})  # as Lightning's launcher leaves it
    assert partial.returncode == 0 and partial.stdout.strip() == "(2, -1, 1)", partial.stderr
    # no launcher at all, then the three values given: one process (the helper reads and
    # writes os.environ on every call; the call without arguments writes nothing)
    alone_then_given = _py("""
        import os
        from habana_frameworks.torch.distributed.hccl import initialize_distributed_hpu as f
        print(f(), "RANK" in os.environ)
        print(f(world_size=3, rank=2, local_rank=0), os.environ["RANK"])
    """)
    assert alone_then_given.returncode == 0, alone_then_given.stderr
    alone, given = alone_then_given.stdout.splitlines()
    assert alone.split() == ["(1,", "-1,", "-1)", "False"], alone_then_given.stdout
    assert given.split() == ["(3,", "2,", "0)", "2"], alone_then_given.stdout
    # as Gaudi's package, ``import habana_frameworks.torch`` alone maps Open MPI's variables
    # (accelerate reads LOCAL_RANK right after it to choose hpu and "hccl")
    package = _py("""
        import os
        import habana_frameworks.torch
        print(*(os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")))
    """, env={"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
              "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    assert package.returncode == 0, package.stderr
    assert package.stdout.split() == ["3", "4", "1", "127.0.0.1"], package.stdout


def test_core_names(monkeypatch) -> None:
    import habana_frameworks.torch.core as htcore

    from hpu_runtime import reset_device

    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    dev = reset_device("gaudi2")
    x = torch.ones(4, device="hpu")
    (x * 3).sum()
    assert dev.pending
    htcore.mark_step()
    assert not dev.pending and dev.graphs_launched == 1
    (x + 2).sum()
    htcore.step_closure._mark_step_if_lazy()
    assert dev.graphs_launched == 2
    assert htcore.is_lazy() is True
    assert htcore.hpu_set_env() is None and htcore.quantization.hpu_set_inference_env() is None
    htcore.hpu_initialize(None)
    htcore.hpu_inference_initialize(None)
    htcore.hpu_teardown_inference_env()
    htcore.hpu_reset_env()


def test_step_closures_run_after_mark_step_and_iter_mark_step_in_order(monkeypatch) -> None:
    """Intel's core/step_closure.py: closures queued by add_step_closure run after the next
    mark_step (after its launch) or iter_mark_step (which launches nothing), each once, in order;
    in eager mode (lazy-mode only functionality) nothing is queued."""
    import habana_frameworks.torch.core as htcore

    from hpu_runtime import reset_device

    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    dev = reset_device("gaudi2")
    seen = []
    x = torch.ones(4, device="hpu")
    y = x * 3
    htcore.add_step_closure(lambda t, tag: seen.append((tag, len(dev.pending), dev.graphs_launched, t is y)),
                            (y, "a"))
    htcore.add_step_closure(seen.append, ["b"])
    assert seen == [] and dev.pending
    htcore.mark_step()
    assert seen == [("a", 0, 1, True), "b"]  # after the launch
    htcore.mark_step()
    assert len(seen) == 2  # each ran once
    # a closure that queues another queues it for the next step
    htcore.add_step_closure(lambda: htcore.add_step_closure(seen.append, ("next",)))
    (x + 1).sum()
    htcore.iter_mark_step()
    assert len(seen) == 2 and dev.pending and dev.graphs_launched == 1  # iter_mark_step launches nothing
    htcore.step_closure.iter_mark_step()
    assert seen[-1] == "next"
    with pytest.raises(TypeError, match="callable"):
        htcore.add_step_closure("not a function")
    with pytest.raises(TypeError, match="tuple"):
        htcore.add_step_closure(print, 3)
    with pytest.raises(TypeError, match="device string"):
        htcore.iter_mark_step([1, 2])
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    reset_device("gaudi2")
    htcore.add_step_closure(seen.append, ("eager",))
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    reset_device("gaudi2")
    htcore.mark_step()
    assert seen[-1] == "next"  # the closure given in eager mode was never queued


def test_hpu_set_inference_env_folds_conv_bn_as_intels_does(monkeypatch) -> None:
    """Model-References' inference.py: ``model = htcore.hpu_set_inference_env(model)`` before
    ``.to("hpu")``. The fold (Conv2d then BatchNorm2d into one Conv2d) gives the unfused model's
    outputs; on the card the forward then runs no batch norm; the caller's model is unchanged;
    a model in training mode comes back as it is."""
    import habana_frameworks.torch.core as htcore
    import torchvision

    from hpu_runtime import bridge_disabled, reset_device

    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")  # the forward's ops are read from the pending graph
    dev = reset_device("gaudi2")
    with bridge_disabled():
        torch.manual_seed(0)
        model = torchvision.models.resnet18(num_classes=10)
        for m in model.modules():  # running statistics away from the identity, so the fold matters
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
        x = torch.randn(2, 3, 64, 64)
        model.eval()
        with torch.no_grad():
            want = model(x)
    assert htcore.hpu_set_inference_env(model.train()) is model  # training mode: not folded
    model.eval()
    fused = htcore.hpu_set_inference_env(model)
    assert fused is not model
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fused.modules())
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()) == 20  # the caller's model kept
    fused.to("hpu")
    htcore.mark_step()
    with torch.no_grad():
        out = fused(x.to("hpu"))
    names = [c.name for c in dev.pending]
    assert sum("convolution" in n for n in names) == 20 and not any("batch_norm" in n for n in names)
    torch.testing.assert_close(out.cpu(), want, rtol=1e-4, atol=1e-4)
    assert htcore.hpu_set_inference_env(fused) is fused  # on the card already: left as it is, as Intel's
    assert sum(isinstance(m, torch.nn.Conv2d) for m in htcore.hpu_set_env(model).modules()) == 20  # older name


def test_hpu_names(tmp_path: Path) -> None:
    import habana_frameworks.torch as ht
    import habana_frameworks.torch.hpu as hthpu

    from hpu_runtime import reset_device

    reset_device("gaudi2")
    assert hthpu.is_available() and hthpu.current_device() == 0
    # the server's cards, as Gaudi's device_count(); HABANA_VISIBLE_MODULES (Ray sets it) narrows them
    assert hthpu.device_count() == 8
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HABANA_VISIBLE_MODULES", "2,5")
        assert hthpu.device_count() == 2
        mp.setenv("HABANA_VISIBLE_MODULES", "12")  # a local Ray of 16 workers hands out ids 0-15
        assert hthpu.device_count() == 1
        for bad in ("2,x", "2,2", "-1"):
            mp.setenv("HABANA_VISIBLE_MODULES", bad)
            with pytest.raises(ValueError, match=r"HABANA_VISIBLE_MODULES='.*': expected distinct module ids"):
                hthpu.device_count()
    assert hthpu.get_device_name() == "GAUDI2" and hthpu.is_bf16_supported()
    hthpu.set_device(0)
    hthpu.disable_dynamic_shape()
    assert hthpu.get_dynamic_shape_status() is False
    hthpu.enable_dynamic_shape()
    assert hthpu.get_dynamic_shape_status() is True
    t = torch.zeros(1024, device="hpu")
    stats = ht.hpu.memory.memory_stats()
    assert {"Limit", "InUse", "MaxInUse", "NumAllocs"} <= set(stats) and stats["InUse"] >= t.nbytes
    assert hthpu.memory_allocated() == stats["InUse"] and hthpu.max_memory_allocated() >= stats["InUse"]
    assert "InUse" in hthpu.memory.memory_summary()
    free, total = hthpu.mem_get_info()
    assert total == stats["Limit"] and free == total - stats["InUse"]
    hthpu.synchronize()
    # random: the HPU generator is the host generator
    hthpu.random.manual_seed_all(123)
    a = torch.randn(5)
    state = hthpu.random.get_rng_state()
    b = torch.randn(5)
    hthpu.random.set_rng_state(state)
    assert torch.equal(torch.randn(5), b) and hthpu.random.initial_seed() == 123
    torch.manual_seed(123)
    assert torch.equal(torch.randn(5), a)
    with pytest.raises(ValueError, match="1 card"):
        hthpu.random.set_rng_state_all([state, state])
    # metrics
    out = tmp_path / "m.json"
    hthpu.metrics.metrics_dump(str(out), "json")
    assert "graph_compilation" in json.loads(out.read_text())
    assert hthpu.metrics.metric_global("graph_compilation").stats()
    # graphs: the cached model gains Gaudi's methods
    model = torch.nn.Linear(3, 2).to("hpu")
    cacher = ht.hpu.ModuleCacher()
    cached = cacher(model=model, inplace=True)
    cached.set_iteration_count(4)
    assert cacher.iteration_count == 4
    assert ht.hpu.graphs.wrap_in_hpu_graph is hthpu.wrap_in_hpu_graph
    s = hthpu.Stream()
    with hthpu.stream(s):
        pass


@pytest.mark.parametrize("spec,value", [("gaudi", 2), ("gaudi2", 4), ("gaudi3", 5)])
def test_utils_names(spec: str, value: int) -> None:
    import habana_frameworks.torch.utils.debug as htdebug
    import habana_frameworks.torch.utils.experimental as htexp
    from habana_frameworks.torch.utils.library_loader import is_habana_available, load_habana_module

    from hpu_runtime import reset_device

    load_habana_module()
    assert is_habana_available()
    reset_device(spec)
    try:
        assert htexp._get_device_type() == value
        assert (htexp._get_device_type() == htexp.synDeviceType.synDeviceGaudi) is (spec == "gaudi")
        assert htexp._is_fp16_supported() is (spec != "gaudi")
        assert htexp.hpu.is_available()
        # Intel's values; Model-References' GoogLeNet main.py asks the first every step
        assert htdebug._is_enabled_synapse_layout_handling() is True
        assert htdebug._is_enabled_weight_permute_pass() is False
    finally:
        reset_device("gaudi2")


def test_hpex_dynamo_and_transformer_engine_names() -> None:
    from habana_frameworks.torch.dynamo.compile_backend.experimental import (
        compiled_autograd_requested,
        enable_compiled_autograd,
    )
    from habana_frameworks.torch.hpex.experimental import transformer_engine as te
    from habana_frameworks.torch.hpex.normalization import FusedClipNorm
    from habana_frameworks.torch.hpex.optimizers import (  # noqa: F401
        FusedAdamW,
        FusedLamb,
        FusedLars,
        FusedResourceApplyMomentum,
        FusedSGD,
    )

    from hpu_runtime.api import hpex

    assert FusedSGD is hpex.FusedSGD and FusedClipNorm is hpex.FusedClipNorm
    # enabling it changes dynamo process-wide: tests/unit/test_compile_backend.py runs it in a fresh process
    assert callable(enable_compiled_autograd) and compiled_autograd_requested() is None
    torch.manual_seed(0)
    lin = te.Linear(4, 3, bias=True, params_dtype=torch.float32)
    x = torch.randn(2, 4)
    with te.fp8_autocast(enabled=True, fp8_recipe=te.recipe.DelayedScaling(fp8_format=te.recipe.Format.HYBRID)):
        y = lin(x)
    torch.testing.assert_close(y, x @ lin.weight.T + lin.bias)
    available, reason = te.fp8.is_fp8_available()
    assert available is False and "not emulated" in reason


def test_mediapipe_placeholders_say_not_emulated() -> None:
    import habana_dataloader  # noqa: F401
    from habana_frameworks.mediapipe import fn
    from habana_frameworks.mediapipe.media_types import decoderStage, dtype, ftype, imgtype, randomCropType  # noqa: F401
    from habana_frameworks.mediapipe.mediapipe import MediaPipe
    from habana_frameworks.mediapipe.operators.cpu_nodes.cpu_nodes import media_function
    from habana_frameworks.mediapipe.plugins.iterator_pytorch import HPUResnetPytorchIterator

    class Pipe(MediaPipe):  # lightning-habana subclasses it at import
        pass

    for make in (Pipe, media_function, HPUResnetPytorchIterator, fn.ReadImageDatasetFromDir):
        with pytest.raises(NotImplementedError, match="not emulated"):
            make()
    with pytest.raises(ModuleNotFoundError):
        import habana_dataloader.aeon_config  # noqa: F401 - ResNet-50 falls back on this


_FIRST_USE = """
    import json, sys, torch
    {imports}
    before = hasattr(torch, "hpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("hpu")
    out = model(torch.rand(8, 16).to("hpu")).sum()
    out.backward()
    import hpu_runtime
    dev = hpu_runtime.get_device()
    print(json.dumps({{"before": before, "value": out.item(), "device": str(model[0].weight.grad.device),
                      "host_ns": dev.host_ns, "now_ns": dev.now_ns(), "hbm": torch.hpu.max_memory_allocated()}}))
"""


@pytest.mark.timeout(120)
def test_a_script_that_never_imports_gaudi_gets_the_card_on_first_use() -> None:
    """As with Gaudi's autoloading (1.18+): ``.to("hpu")`` in a script with no Gaudi import loads
    the simulated card at that first use, and the run (numerics, simulated host and device time,
    HBM peak) equals the same script with ``import habana_frameworks.torch`` at the top; nothing
    is loaded before (``torch.hpu`` absent), and with the finder switched off the script fails
    as it does on a machine without the card."""
    def run(imports: str, **env: str) -> subprocess.CompletedProcess:
        return _py(_FIRST_USE.format(imports=imports), env=env)

    first_use, explicit = run("pass"), run("import habana_frameworks.torch")
    assert first_use.returncode == 0 and explicit.returncode == 0, first_use.stderr[-3000:] + explicit.stderr[-3000:]
    got, want = json.loads(first_use.stdout.splitlines()[-1]), json.loads(explicit.stdout.splitlines()[-1])
    assert got["before"] is False and want["before"] is True
    assert got["device"] == "hpu:0" and got["host_ns"] > 0 and got["hbm"] > 0
    assert {k: v for k, v in got.items() if k != "before"} == {k: v for k, v in want.items() if k != "before"}
    off = run("pass", HPU_EMULATOR_HABANA_FRAMEWORKS="0")
    assert off.returncode != 0 and "No module named 'torch.hpu'" in off.stderr


def test_habana_dataloader_is_its_host_fallback_torchs_loader() -> None:
    """``HabanaDataLoader`` (Intel's media loader; no media engine here) gives torch's
    DataLoader's batches, in order, from the same arguments."""
    from habana_dataloader import HabanaDataLoader
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    data = TensorDataset(torch.arange(40.0).reshape(20, 2), torch.arange(20))
    sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=3)
    got = list(HabanaDataLoader(data, batch_size=4, sampler=sampler, num_workers=0, pin_memory=True, drop_last=True))
    want = list(DataLoader(data, batch_size=4, sampler=sampler, num_workers=0, drop_last=True))
    assert len(got) == len(want) == 2
    for (gx, gy), (wx, wy) in zip(got, want):
        assert torch.equal(gx, wx) and torch.equal(gy, wy)


@pytest.mark.timeout(60)
def test_hl_smi_reports_what_gaudi_tooling_parses() -> None:
    from launchers.hl_smi import SYNAPSE_VERSION

    ver = subprocess.run(["hl-smi", "-v"], capture_output=True, text=True, timeout=30)
    assert ver.returncode == 0
    assert re.search(r"hl-([\d\.]+)", ver.stdout).group(1) == SYNAPSE_VERSION  # lightning-habana's regex
    assert re.search(r"fw-([\d\.]+)", ver.stdout)
    table = subprocess.run(["hl-smi"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    assert f"Driver Version: {SYNAPSE_VERSION}" in table[2]  # optimum-habana reads line 3
    listing = subprocess.run(["hl-smi", "-L"], capture_output=True, text=True, timeout=30,
                             env={**os.environ, "HPU_DEVICE_SPEC": "gaudi3"}).stdout
    assert "hl-gaudi3" in listing
    # the cards hl-smi lists are the ones torch.hpu.device_count() counts (Gaudi's synDeviceGetCount)
    import torch

    assert listing.count("Module ID") == torch.hpu.device_count() == 8


def test_status_table_names_every_module_we_ship() -> None:
    """Each emulated module appears in the status table of habana_frameworks.torch."""
    import habana_frameworks.torch as ht

    text = ht.__doc__.replace("``", "")
    checked = 0
    root = REPO / "hpu_runtime" / "api" / "habana_frameworks" / "torch"
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        if not parts or parts[-1] in ("quantization", "recipe", "fp8", "distributed_utils"):
            continue
        # named in full, or inside its parent's row (``Fp8Ops.cast_to_fp8_v2`` under ``torch.hpex.kernels``)
        named = "torch." + ".".join(parts) in text or ("torch." + ".".join(parts[:-1]) in text and parts[-1] in text)
        assert named, f"{rel} missing from the status table"
        checked += 1
    assert checked >= 20, checked
