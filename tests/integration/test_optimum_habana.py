"""optimum-habana 1.21.2 runs unmodified on the emulator: ``models/examples/run_clm.py`` (a GaudiTrainer script
in the manner of optimum-habana's run_clm example) on 1 and 2 ranks.

optimum-habana pins transformers 4.55.x, so it lives in its own environment (``.ci/run`` builds
it: ``pip install -e '.[optimum]' ./hpu_runtime/_packaging/habana_torch_plugin`` in a venv over
the system's torch); ``HPU_OPTIMUM_PYTHON`` names that environment's python. Without it the
tests skip, except in CI (``CI`` set), where they fail: CI must run them.

References: HPU graphs against the same run without them; a resumed run against the
uninterrupted one; 2 ranks over hccl against the same script over gloo (a default group made
before the script runs, which accelerate keeps). Dropout is off so runs compare bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.integration.launch_helpers import REPO, clean_env, free_port

PYTHON = os.environ.get("HPU_OPTIMUM_PYTHON")
SCRIPT = str(REPO / "models" / "examples" / "run_clm.py")
UNDER_GLOO = str(REPO / "tests" / "integration" / "scripts" / "under_gloo.py")

if not PYTHON:
    if os.environ.get("CI"):
        raise RuntimeError("HPU_OPTIMUM_PYTHON is not set: .ci/run builds the optimum-habana environment and sets it")
    pytest.skip("HPU_OPTIMUM_PYTHON not set (the optimum-habana environment, see .ci/run)", allow_module_level=True)

COMMON = ["--overwrite_output_dir", "--do_train", "--per_device_train_batch_size", "4", "--report_to", "none",
          "--logging_steps", "1", "--learning_rate", "1e-3", "--seed", "0", "--dropout", "0", "--use_habana",
          "--max_train_samples", "64", "--max_eval_samples", "8", "--per_device_eval_batch_size", "4"]


def _env() -> dict[str, str]:
    """The environment activated, as a user's shell has it: optimum-habana runs ``pip list``."""
    env = clean_env()
    env["PATH"] = os.pathsep.join([str(Path(PYTHON).parent), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(Path(PYTHON).parent.parent)
    return env


def _script(name: str, *args: str, result: str) -> tuple[dict, str]:
    """Run ``tests/integration/scripts/<name>`` in the optimum environment (lazy mode); its JSON
    result (the stdout line starting with ``result``) and its stderr."""
    proc = subprocess.run([PYTHON, str(REPO / "tests" / "integration" / "scripts" / name), *args], cwd=REPO,
                          env={**_env(), "PT_HPU_LAZY_MODE": "1"}, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith(result))), proc.stderr


def _as_open_mpi(cmd: list[str], ranks: int, env: dict[str, str], logs: Path) -> subprocess.CompletedProcess[str]:
    """``cmd`` started ``ranks`` times with only the variables Open MPI's ``mpirun`` gives each rank
    (``OMPI_COMM_WORLD_*``; no ``RANK`` or ``LOCAL_RANK``) and the ``MASTER_ADDR`` / ``MASTER_PORT``
    that optimum-habana's ``gaudi_spawn.py --use_mpi`` exports before it runs ``mpirun``; rank 0's
    output, every rank's return code checked. Each rank writes to its own files under ``logs``
    (a pipe nobody reads while we wait on another rank could fill and stall the job)."""
    port = str(free_port())  # gaudi_spawn's is 29500: a free one, beside other tests
    logs.mkdir(parents=True, exist_ok=True)
    procs, files = [], []
    try:
        for r in range(ranks):
            out, err = open(logs / f"rank{r}.out", "w"), open(logs / f"rank{r}.err", "w")
            files += [out, err]
            procs.append(subprocess.Popen(
                cmd, cwd=REPO, stdout=out, stderr=err, text=True,
                env={**env, "MASTER_ADDR": "localhost", "MASTER_PORT": port, "OMPI_COMM_WORLD_SIZE": str(ranks),
                     "OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_RANK": str(r),
                     "OMPI_COMM_WORLD_LOCAL_SIZE": str(ranks)}))
        for p in procs:
            p.wait(timeout=280)
    finally:
        for p in procs:
            p.kill()
        for f in files:
            f.close()
    texts = [((logs / f"rank{r}.out").read_text(), (logs / f"rank{r}.err").read_text()) for r in range(ranks)]
    for p, (out, err) in zip(procs, texts):
        assert p.returncode == 0, out[-3000:] + err[-6000:]
    return subprocess.CompletedProcess(cmd, 0, *texts[0])


def _run(tmp: Path, name: str, *args: str, ranks: int = 1, script_prefix: tuple[str, ...] = (),
         lazy: bool = True, launcher: str = "torchrun") -> dict:
    """Run the script (for ``ranks`` > 1 under torchrun, or as Open MPI starts ranks); returns rank
    0's log and every rank's parameters."""
    dump = tmp / name
    launch = [PYTHON] if ranks == 1 or launcher == "mpirun" else [
        PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    if launcher == "deepspeed":  # DeepSpeed's launcher, LOCAL_RANK in the environment only
        launch = [PYTHON, "-m", "deepspeed.launcher.runner", "--num_gpus", str(ranks), "--master_port",
                  str(free_port()), "--no_local_rank"]
    cmd = [*launch, *script_prefix, SCRIPT, *COMMON, "--output_dir", str(tmp / f"out_{name}"),
           "--dump_params_dir", str(dump), *args]
    env = {**_env(), "PT_HPU_LAZY_MODE": "1" if lazy else "0"}
    if launcher == "mpirun":
        proc = _as_open_mpi(cmd, ranks, env, tmp / f"logs_{name}")
    else:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    log = json.loads((dump / "log_rank0.json").read_text())
    log["params"] = [torch.load(dump / f"params_rank{r}.pt") for r in range(ranks)]
    log["losses"] = [h["loss"] for h in log["log_history"] if "loss" in h]
    log["output"] = proc.stdout + proc.stderr
    return log


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _decreasing(losses: list[float]) -> None:
    assert len(losses) >= 6 and sum(losses[-3:]) / 3 < losses[0] - 0.2, losses


@pytest.mark.slow
def test_gpt2_lazy_bf16_hpu_graphs_eval_checkpoint_and_resume(tmp_path) -> None:
    """Lazy mode, fused AdamW and clip norm, bf16 autocast, HPU graphs for training and inference,
    evaluation, checkpoints every 4 steps; graphs equal the run without them, and resuming from
    step 4 ends where the uninterrupted run ends."""
    flags = ["--use_lazy_mode", "--bf16", "--max_steps", "8", "--do_eval", "--save_strategy", "steps",
             "--save_steps", "4"]
    graphs = _run(tmp_path, "graphs", *flags, "--use_hpu_graphs_for_training", "--use_hpu_graphs_for_inference")
    plain = _run(tmp_path, "plain", *flags, "--adjust_throughput")
    _decreasing(graphs["losses"])
    assert graphs["param_device"].startswith("hpu") or graphs["param_device"] == "cpu"
    assert pytest.approx(plain["losses"], abs=2e-3) == graphs["losses"]
    assert _max_diff(graphs["params"][0], plain["params"][0]) < 1e-4
    eval_loss = graphs["results"]["eval"]["eval_loss"]
    assert eval_loss == pytest.approx(plain["results"]["eval"]["eval_loss"], abs=2e-3)
    checkpoint = tmp_path / "out_graphs" / "checkpoint-4"
    assert (checkpoint / "optimizer.pt").exists() and (tmp_path / "out_graphs" / "checkpoint-8").exists()
    resumed = _run(tmp_path, "resumed", *flags, "--use_hpu_graphs_for_training", "--resume_from_checkpoint",
                   str(checkpoint))
    assert _max_diff(resumed["params"][0], graphs["params"][0]) < 1e-5
    assert "simulated Gaudi" in graphs["output"]  # the throughput lines say which clock they read
    # --adjust_throughput leaves the (simulated) time of logging, evaluating and saving out of the rate
    samples = 8 * 4
    for run, adjusted in ((graphs, False), (plain, True)):
        train = run["results"]["train"]
        assert train["train_clock"] == "simulated Gaudi"
        unadjusted = samples / train["train_runtime"]
        if adjusted:
            assert train["train_samples_per_second"] > unadjusted * 1.001
        else:
            assert train["train_samples_per_second"] == pytest.approx(unadjusted, rel=1e-3)


def test_bert_masked_lm_lazy_without_fused_optimizer(tmp_path) -> None:
    log = _run(tmp_path, "bert", "--model_type", "bert", "--use_lazy_mode", "--max_steps", "8",
               "--use_fused_adam", "False", "--use_fused_clip_norm", "False", "--learning_rate", "3e-3")
    _decreasing(log["losses"])


_TWO_RANKS = ["--use_lazy_mode", "--max_steps", "6", "--use_fused_adam", "False", "--use_fused_clip_norm", "False"]


@pytest.fixture(scope="module")
def gloo_ddp(tmp_path_factory) -> dict:
    """The reference of the 2-rank DDP cases: distribution_strategy ddp in lazy mode under torchrun,
    its collectives over gloo (the compile case below equals it too: compile and lazy mode compute
    the same numbers)."""
    return _run(tmp_path_factory.mktemp("gloo_ddp"), "gloo", *_TWO_RANKS, "--distribution_strategy", "ddp", ranks=2,
                script_prefix=(UNDER_GLOO,))


@pytest.mark.slow
def test_ddp_and_fast_ddp_on_two_ranks_under_torchrun_and_open_mpi_equal_gloo(tmp_path, gloo_ddp) -> None:
    """distribution_strategy ddp over hccl, started as optimum-habana's documented multi-card
    launch starts it, ``gaudi_spawn.py --use_mpi`` (Open MPI's ``mpirun``: ranks see only
    ``OMPI_COMM_WORLD_*``): parameters equal on both ranks and equal the same script's under
    torchrun over gloo exactly. ``import habana_frameworks.torch`` maps the MPI variables to
    ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` as Gaudi's does, so accelerate picks hpu and "hccl" (it
    read no ``LOCAL_RANK`` and trained on the CPU over gloo, with no simulated time, before).

    distribution_strategy fast_ddp over hccl under torchrun --nproc-per-node 2: parameters equal on
    both ranks, and equal the gloo DDP run within bf16 rounding (fast_ddp all-reduces the gradients
    in a bf16 fusion buffer). (GaudiTrainer's DDP under torchrun over hccl also runs in the compile
    test below.)"""
    gloo = gloo_ddp
    mpi = _run(tmp_path, "mpi", *_TWO_RANKS, "--distribution_strategy", "ddp", ranks=2, launcher="mpirun")
    fast = _run(tmp_path, "fast", *_TWO_RANKS, "--distribution_strategy", "fast_ddp", ranks=2)
    assert gloo["backend"] == "gloo"
    assert mpi["backend"] == "hccl" and mpi["param_device"].startswith("hpu"), (mpi["backend"], mpi["param_device"])
    assert "train_clock" in mpi["output"] and "simulated Gaudi" in mpi["output"]
    assert _max_diff(mpi["params"][0], mpi["params"][1]) == 0.0
    _decreasing(mpi["losses"])
    assert _max_diff(mpi["params"][0], gloo["params"][0]) == 0.0 and mpi["losses"] == gloo["losses"]
    assert fast["backend"] == "hccl" and _max_diff(fast["params"][0], fast["params"][1]) == 0.0
    _decreasing(fast["losses"])
    assert 0.0 < _max_diff(fast["params"][0], gloo["params"][0]) < 2e-2  # rounded, and only by it
    assert fast["losses"][0] == gloo["losses"][0]
    assert pytest.approx(gloo["losses"], abs=2e-2) == fast["losses"]


@pytest.mark.slow
def test_deepspeed_zero1_on_two_ranks_equals_gloo(tmp_path) -> None:
    """GaudiTrainer with ``--deepspeed`` (ZeRO-1, DeepSpeed's HPU FusedAdam) under DeepSpeed's
    launcher over hccl: both ranks end equal, and equal the same run over gloo."""
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                                  "gradient_clipping": "auto", "zero_optimization": {"stage": 1}}))
    flags = ["--use_lazy_mode", "--max_steps", "6", "--deepspeed", str(config)]
    hccl = _run(tmp_path, "hccl", *flags, ranks=2, launcher="deepspeed")
    gloo = _run(tmp_path, "gloo", *flags, ranks=2, launcher="deepspeed", script_prefix=(UNDER_GLOO,))
    assert hccl["backend"] == "hccl" and gloo["backend"] == "gloo" and hccl["param_device"].startswith("hpu")
    assert _max_diff(hccl["params"][0], hccl["params"][1]) == 0.0
    assert _max_diff(hccl["params"][0], gloo["params"][0]) == 0.0 and hccl["losses"] == gloo["losses"]
    _decreasing(hccl["losses"])


@pytest.mark.slow
def test_accelerate_launch_sizes_the_job_by_the_servers_cards_and_picks_hccl(tmp_path) -> None:
    """``accelerate launch --num_processes 2`` starts a distributed job only when
    ``torch.hpu.device_count()`` says the machine has more than one card, as a Gaudi server's
    (8) does: the emulator answered 1, and the two processes trained apart, each on its own
    (DistributedType.NO), with no error. Now the job is MULTI_HPU over "hccl", and equals the
    same job over gloo."""
    script = str(REPO / "tests" / "integration" / "scripts" / "accelerate_ddp.py")

    def launch(name: str, *prefix: str) -> list[dict]:
        cmd = [PYTHON, "-m", "accelerate.commands.launch", "--num_processes", "2", "--main_process_port",
               str(free_port()), *prefix, script, str(tmp_path / name)]
        proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=280)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        return [torch.load(tmp_path / name / f"rank{r}.pt") for r in range(2)]

    hccl = launch("hccl")
    gloo = launch("gloo", UNDER_GLOO)
    first = hccl[0]
    assert (first["distributed_type"], first["backend"], first["num_processes"]) == (
        "DistributedType.MULTI_HPU", "hccl", 2), first
    assert first["device"].startswith("hpu") and gloo[0]["backend"] == "gloo"
    assert _max_diff(dict(enumerate(hccl[0]["params"])), dict(enumerate(hccl[1]["params"]))) == 0.0
    assert _max_diff(dict(enumerate(hccl[0]["params"])), dict(enumerate(gloo[0]["params"]))) == 0.0
    assert hccl[0]["losses"] == gloo[0]["losses"] and len(hccl[0]["losses"]) == 4  # 64 samples / 2 ranks / 8


@pytest.mark.slow
def test_compile_mode_on_two_ranks_equals_gloo(tmp_path, gloo_ddp) -> None:
    """Eager mode with torch_compile and the hpu_backend (PT_HPU_LAZY_MODE=0): two ranks under DDP
    (DDPOptimizer's graph breaks over hccl) train, and equal each other and, exactly, the same
    job in lazy mode over gloo (the compiled regions compute what the ops one by one compute)."""
    flags = ["--use_lazy_mode", "False", "--torch_compile", "--torch_compile_backend", "hpu_backend",
             *_TWO_RANKS[1:]]
    hccl = _run(tmp_path, "hccl", *flags, "--distribution_strategy", "ddp", ranks=2, lazy=False)
    gloo = gloo_ddp
    assert hccl["backend"] == "hccl" and gloo["backend"] == "gloo"
    assert hccl["dynamo_graphs"] >= 2 and gloo["dynamo_graphs"] == 0  # DDPOptimizer splits at buckets
    assert _max_diff(hccl["params"][0], hccl["params"][1]) == 0.0
    assert _max_diff(hccl["params"][0], gloo["params"][0]) == 0.0 and hccl["losses"] == gloo["losses"]
    assert hccl["losses"][-1] < hccl["losses"][0] - 0.2


def test_every_habana_frameworks_name_optimum_habana_uses_resolves() -> None:
    """The environment has optimum-habana's pins over this project's torch, and
    hpu_runtime.tools.habana_names finds none of the names optimum-habana's source uses missing
    (the fp8/int4 ops are defined to refuse with an error naming them)."""
    code = ("import optimum.habana, transformers, torch, sys; "
            "print(optimum.habana.__version__, transformers.__version__, torch.__version__); "
            "from hpu_runtime.tools.habana_names import main; sys.exit(main(['optimum.habana']))")
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=180, env=_env(), cwd=REPO)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    versions = next(line for line in out.stdout.splitlines() if line.startswith("1.21"))
    oh, tf, th = versions.split()
    assert oh == "1.21.2" and tf.startswith("4.55.") and th == torch.__version__, versions
    last = out.stdout.strip().splitlines()[-1]
    assert last.endswith("0 missing") and int(last.split()[0]) >= 60, last
    for name in ("habana_frameworks.torch.hpex.kernels.FusedSDPA", "torch.ops.hpu.rotary_pos_embedding",
                 "habana_frameworks.torch.hpu.sdp_kernel", "habana_frameworks.torch.core.hpu"):
        assert f"{name} " in out.stdout


def test_text_generation_times_the_simulated_gaudi() -> None:
    """optimum-habana's text generation (``run_generation.py``'s flow: ``adapt_transformers_to_gaudi``,
    ``generate(..., iteration_times=...)``, ``HabanaGenerationTime``) reports the simulated card's
    latencies: wall seconds of host work the card never sees change none of them, while the
    model-initialization timer (it spans host work before the card is used) counts them; HPU graphs
    cut the per-token latency (per-op host work gone) and generate the same tokens."""
    runs, stderr = _script("optimum_generate.py", "--host-sleep", "0.05", result='{"init"')
    assert "read the simulated Gaudi clock" in stderr
    lazy, slept, graphs = runs["lazy"], runs["lazy_host_sleep"], runs["hpu_graphs"]
    # 0.05 s before each of 5 forwards, absent from every figure (the clock's values are on a grid
    # of 2**-33 s, so the same simulated durations at another instant may differ in that last bit)
    assert slept["tokens"] == lazy["tokens"] and slept["e2e"] == pytest.approx(lazy["e2e"], rel=1e-8)
    assert slept["iteration_times"] == pytest.approx(lazy["iteration_times"], rel=1e-8)
    assert runs["init"] >= 0.05
    assert len(lazy["iteration_times"]) == 5 and lazy["e2e"] >= sum(lazy["iteration_times"]) > 0
    assert lazy["iteration_times"][0] > max(lazy["iteration_times"][1:])  # the first token: prefill + sync
    assert max(graphs["iteration_times"][1:]) < min(lazy["iteration_times"][1:])
    assert graphs["tokens"] == lazy["tokens"]


def test_transformers_trainer_reports_the_simulated_gaudis_throughput(tmp_path) -> None:
    """transformers' own Trainer (no optimum-habana), imported before the emulator, trains on hpu and
    reports runtime and rates on the simulated clock: two steady-state runs give the same figures,
    one of them with wall seconds of host sleep at every step (its wall runtime holds them);
    the rates are the steps and samples over that runtime."""
    steps = 4
    out, _ = _script("hf_trainer.py", "--output-dir", str(tmp_path / "out"), "--steps", str(steps), "--host-sleep",
                     "0.05", result='{"device"')
    assert out["device"] == out["param_device"] == "hpu:0"
    first, steady, slept = out["runs"]
    assert all(r["train_clock"] == "simulated Gaudi" for r in out["runs"])
    assert first["train_runtime"] > steady["train_runtime"] > 0  # the first run compiles its recipes
    assert slept["train_runtime"] == steady["train_runtime"]
    # the wall clock saw the sleeps (not compared with the steady run's wall time: under load that
    # one can take longer than the slept run, as it did once in a full suite)
    assert slept["train_wall_runtime"] >= steps * 0.05
    # (the runtime is reported rounded to the microsecond, the rates from the unrounded one)
    assert steady["train_steps_per_second"] == pytest.approx(steps / steady["train_runtime"], rel=1e-4)
    assert steady["train_samples_per_second"] == pytest.approx(4 * steps / steady["train_runtime"], rel=1e-4)


def test_stable_diffusion_pipeline_with_hpu_graphs_equals_without() -> None:
    """optimum-habana's GaudiStableDiffusionPipeline with ``use_hpu_graphs`` (it caches its UNet graphs
    with Intel's ``graphs.input_hash`` / ``copy_to`` / ``CachedParams``, which the emulator lacked):
    the same images as without graphs, from one graph captured and replayed at every later step; its
    throughput is the simulated card's (the same with wall seconds of host sleep at every step)."""
    runs, _ = _script("optimum_diffusion.py", result='{"plain"')
    assert runs["plain"]["shape"] == [2, 16, 16, 3]
    assert runs["graphs"]["sum"] == runs["plain"]["sum"] and runs["graphs"]["shape"] == runs["plain"]["shape"]
    assert runs["plain"]["cached_graphs"] == 0 and runs["graphs"]["cached_graphs"] == 1
    steady, slept = runs["graphs_steady"], runs["graphs_steady_host_sleep"]
    assert steady["sum"] == slept["sum"] == runs["plain"]["sum"] and slept["cached_graphs"] == 1
    assert slept["throughput"] == steady["throughput"] > 0
