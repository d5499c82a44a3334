"""The training entry point: DDP over "hccl" on a simulated Gaudi per rank.

Run it like a Gaudi job::

    torchrun --standalone --nproc-per-node 4 -m models.train --model mlp --dataset digits
    torchrun --standalone --nproc-per-node 2 -m models.train --model resnet50 --flavour debug

Every registered model trains (``mlp``, ``resnet50``, ``resnext101``, ``bert-large``,
``gpt2``); without ``--dataset`` the model's own dataset is used (mlp: digits, image models:
digits-images, BERT: text-mlm, GPT-2: text-lm) and the loss is the one
:func:`models.zoo.task_loss` gives the tracer too. Classifiers report the held-out
``test_accuracy``; text models the held-out ``test_loss`` (GPT-2 also ``test_perplexity``).

A model of your own trains too: ``--model package.module:factory`` (``factory(batch_size) ->
(model, inputs, loss_fn)``, the contract of :func:`models.zoo.resolve_factory`) or one of
torchvision's image classifiers, ``--model torchvision.models:efficientnet_b0``. Each rank
trains on the factory's own batch, the same every step, for ``--max-steps`` steps per epoch
(default :data:`FACTORY_EPOCH_STEPS`), with no held-out evaluation: the step the studies
plan for that spec, run live (``launchers.study bucket --live``).

Each rank reads ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (torchrun, or a launcher in
``launchers/``), trains with ``DistributedDataParallel`` and a ``DistributedSampler`` in one
of Gaudi's execution modes (``--mode``, default from ``PT_HPU_LAZY_MODE``: :data:`MODES`), and
reports per epoch the training loss, the held-out test accuracy, the *simulated* Gaudi step
time split into compute, communication and exposed (non-overlapped) communication, and the
*wall-clock* time of the epoch on this machine (labelled as such). Rank 0 writes a JSON
summary with ``--summary``. :func:`main` returns the same summary dict on every rank.
"""

from __future__ import annotations

import argparse
import functools
import gc
import itertools
import json
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

import hpu_runtime as hpu
from hccl.config import card_and_box
from hccl.sim import cluster
from hpu_runtime.bridge.config import RuntimeConfig
from hpu_runtime.cli_args import count, real
from hpu_runtime.files import atomic_open
from hpu_runtime.tools.tracing import MODES, OPTIMIZERS, ddp_graph_split, make_optimizer, prepare_model, training_step
from hpu_runtime.device.spec import DEVICE_SPECS

from .data import dataset_names, load_dataset
from .registry import build_model, model_kind, model_names
from .zoo import TrainingStep, check_sizes, resolve_factory, split_batch, task_loss

__all__ = ["MODES", "build_parser", "main", "UsageError", "DEAD_RANK_EXIT", "FACTORY_EPOCH_STEPS"]

DEAD_RANK_EXIT = 43
"""Exit status of a process killed by ``--dead-rank``."""

FACTORY_EPOCH_STEPS = 10
"""Steps per epoch of a model factory's run (``--model package.module:factory``) when
``--max-steps`` is 0: it has no dataset whose end would end the epoch."""

log = logging.getLogger("models.train")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m models.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mlp",
                   help=f"registered model ({', '.join(model_names())}), package.module:factory or"
                        " torchvision.models:NAME (trained on the factory's own batch)")
    p.add_argument("--flavour", default=None, help="model flavour (e.g. debug; mlp also has large)")
    p.add_argument("--hidden", type=count(1, 1 << 20), default=None, help="override the hidden width (mlp, bert-large, gpt2)")
    p.add_argument("--dataset", default=None, choices=dataset_names(),
                   help="default: the model's own (mlp: digits, vision: digits-images, bert-large: text-mlm,"
                        " gpt2: text-lm)")
    p.add_argument("--seq-len", type=count(1, 1 << 20), default=None, help="tokens per sample, text models (default: the flavour's)")
    p.add_argument("--image-size", type=count(8, 8192, "pixels"), default=None,
                   help="pixels per side, image models (default: the flavour's, 224 full / 32 debug)")
    p.add_argument("--eval-samples", type=count(0, 10**9), default=0,
                   help="evaluate on at most this many held-out samples (0 = all)")
    p.add_argument("--epochs", type=count(1, 10**6), default=5)
    p.add_argument("--batch-size", type=count(1, 1 << 20), default=16, help="per-rank batch size")
    p.add_argument(
        "--optimizer",
        default="sgd",
        choices=["adam", *(o for o in OPTIMIZERS if o != "none")],
        help="sgd (default, with --momentum), adam, adamw, or Gaudi's fused hpex ones (fused-sgd, fused-adamw,"
        " fused-lamb, fused-lars: one kernel per group); torch's Adam computes its bias corrections on the host"
        " every step and the bridge copies the new values to the device (one batched copy per step, no"
        " recompile), besides running op by op where FusedAdamW is one kernel",
    )
    p.add_argument("--lr", type=real(0.0, 100.0), default=0.05)
    p.add_argument("--momentum", type=real(0.0, 1.0), default=0.9, help="SGD momentum")
    p.add_argument("--seed", type=count(0, 2**63 - 1), default=0)
    p.add_argument("--bucket-cap-mb", type=real(0.0, 1e6, "MB", lo_open=True), default=25.0, help="DDP bucket size, MB")
    p.add_argument("--gradient-as-bucket-view", action="store_true")
    p.add_argument("--static-graph", action="store_true")
    p.add_argument("--autocast", action="store_true",
                   help="forward and loss under torch.autocast('hpu', dtype=torch.bfloat16), as Habana's recipes"
                        " (see PT_HPU_AUTOCAST_FP32_ON_HOST to compute those regions in fp32 on this CPU)")
    p.add_argument("--device-spec", default=None,
                   help=f"simulated device: {', '.join(sorted(DEVICE_SPECS))} (default: HPU_DEVICE_SPEC, else the"
                        " generation of the topology's boxes, else gaudi2)")
    p.add_argument(
        "--topology",
        default=None,
        help="network topology for the simulated collectives: hls1, hls2, hls3 or a topology file"
        " (sets HCCL_TOPOLOGY; default: HCCL_TOPOLOGY, else the box of the device's generation, else hls2)",
    )
    p.add_argument("--backend", default="hccl", choices=["hccl", "gloo"], help="process-group backend")
    p.add_argument("--mode", default=None, choices=MODES,
                   help="execution mode (default: PT_HPU_LAZY_MODE, 1 lazy / 0 eager); compile: torch.compile with"
                        " hpu_backend, hpu_graphs: lazy with the model in HPU graphs (ModuleCacher)")
    p.add_argument("--max-steps", type=count(0, 10**9), default=0, help="stop each epoch after this many steps (0 = all)")
    p.add_argument("--summary", default=None, help="rank 0 writes the JSON summary here")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--trace", default=None, metavar="DIR",
                   help="write each rank's Chrome trace of the simulated timeline to DIR (rank 0 merges them)")
    p.add_argument("--pg-timeout", type=real(0.0, 1e7, "wall seconds", lo_open=True), default=None, metavar="SECONDS",
                   help="the process group's timeout (default: torch's); a dead peer ends the job within it")
    cluster.add_arguments(p)
    return p


def _init_distributed(backend: str, timeout_s: float | None = None) -> tuple[int, int]:
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    if not dist.is_initialized():
        kw = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
        dist.init_process_group(backend, **kw)
    return dist.get_rank(), dist.get_world_size()


@torch.no_grad()
def _evaluate(model: torch.nn.Module, data, kind, args) -> dict[str, float]:
    """Held-out metrics: ``test_accuracy`` (classifiers) or ``test_loss`` (text; GPT-2 also
    ``test_perplexity`` = exp of it), the loss averaged over batches weighted by their size.

    Tabular data is evaluated in one batch (as before); other data in ``--batch-size`` batches.
    """
    if args.eval_samples:
        data = torch.utils.data.Subset(data, range(min(args.eval_samples, len(data))))
    chunk = len(data) if kind.kind == "tabular" else args.batch_size
    was_training = model.training
    model.eval()
    total = torch.zeros((), device="hpu")
    n = 0
    batches = iter(DataLoader(data, batch_size=chunk))
    while True:
        with hpu.bridge_disabled():  # host-side data loading is not device work
            batch = next(batches, None)
        if batch is None:
            break
        inputs, targets = split_batch(kind.task, [t.to("hpu") for t in batch])
        out = model(*inputs)
        size = inputs[0].shape[0]
        if kind.task == "classify":
            total += (out.argmax(dim=1) == targets[0]).float().sum()
        else:
            total += task_loss(kind.task, out, targets) * size
        n += size
    model.train(was_training)
    mean = (total / max(n, 1)).item()
    if kind.task == "classify":
        return {"test_accuracy": mean}
    if kind.task == "causal-lm":
        return {"test_loss": mean, "test_perplexity": math.exp(mean)}
    return {"test_loss": mean}


def _factory_of(args) -> Callable[[int], TrainingStep]:
    """The model factory ``--model`` names (it is not a registered model), after the flags that
    cannot apply to one are refused."""
    spec = args.model
    name, colon, flavour = spec.partition(":")
    if name in model_names() and colon:
        raise ValueError(f"--model {spec!r}: give a registered model's flavour with --flavour"
                         f" (--model {name} --flavour {flavour})")
    for flag, value in (("--flavour", args.flavour), ("--hidden", args.hidden), ("--dataset", args.dataset)):
        if value is not None:
            raise ValueError(f"{flag} applies to registered models, not to the model factory {spec!r}"
                             " (it trains on its own batch)")
    sizes = {k: v for k, v in (("seq_len", args.seq_len), ("image_size", args.image_size)) if v is not None}
    return resolve_factory(spec, **sizes)


def _dataset_steps(loader: DataLoader, task: str) -> Iterator[tuple[tuple, Callable]]:
    """``(inputs, loss_fn)`` of each batch of ``loader``, read with the bridge off (host-side
    data loading is not device work)."""
    batches = iter(loader)
    while True:
        with hpu.bridge_disabled():
            batch = next(batches, None)
        if batch is None:
            return
        inputs, targets = split_batch(task, batch)
        yield inputs, functools.partial(task_loss, task, targets=targets)


class UsageError(ValueError):
    """Bad flags or variables, found before any work: ``python -m models.train`` prints the
    message and exits with status 2, as argparse does for a malformed flag."""


def _check(args: argparse.Namespace) -> tuple:
    """Validate ``args`` and settle what they leave open (dataset, sizes, card and system, mode,
    the cluster's condition), before any work; ``(factory, kind, condition, dead)``.

    Raises:
        ValueError: naming the flag or variable at fault.
    """
    for name in ("epochs", "batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.bucket_cap_mb <= 0:
        raise ValueError("--bucket-cap-mb must be > 0")
    if args.eval_samples < 0:
        raise ValueError("--eval-samples must be >= 0")
    factory = _factory_of(args) if args.model not in model_names() else None
    kind = None
    if factory is None:
        kind = model_kind(args.model, args.flavour, hidden=args.hidden)
        args.seq_len, args.image_size = check_sizes(args.model, kind, seq_len=args.seq_len,
                                                    image_size=args.image_size)
        if args.dataset is None:
            args.dataset = kind.dataset
        elif args.dataset != kind.dataset:
            raise ValueError(f"model {args.model!r} ({kind.kind}, {kind.task}) trains on dataset {kind.dataset!r},"
                             f" not {args.dataset!r}")
    # a box holds cards of one generation: either setting follows the other, and they must agree
    args.device_spec, os.environ["HCCL_TOPOLOGY"] = card_and_box(args.device_spec, args.topology)
    condition = cluster.from_args(args)  # flags given here override a launcher's HCCL_SIM_* variables
    os.environ.update(condition.env())
    condition = cluster.from_env()  # what every rank's process group reads
    dead = condition.whatif.dead_rank if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0" else None
    if args.mode is None:
        args.mode = "lazy" if RuntimeConfig.from_env().lazy else "eager"
    if args.mode == "compile":  # torch's DDPOptimizer refuses a cap below its first bucket: say so now
        ddp_graph_split(args.bucket_cap_mb)
    os.environ["PT_HPU_LAZY_MODE"] = "1" if args.mode in ("lazy", "hpu_graphs") else "0"
    return factory, kind, condition, dead


# NOTE [the group outlives DDP]
# DDP's reducer (C++) holds the process group. Where the reducer drops the last reference, the
# group's destructor runs with the GIL held (torch binds the reducer without releasing it), and
# gloo's destructor waits for its worker threads, one of which may be finishing a work whose
# tensors need the GIL to be freed: a deadlock at exit (pytorch/pytorch#56297; a gloo DDP job
# of this project's tests hung once so: its main thread in ~ProcessGroupGloo under ~Reducer, a
# gloo worker thread waiting for the GIL in ~AsyncAllreduceWork). So DDP goes first, collected
# while the group registry still holds the group, and destroy_process_group, which releases the
# GIL, destroys it.


def main(argv: list[str] | None = None) -> dict:
    """Train; return the summary dict (rank 0 also writes it to ``--summary``).

    Raises:
        UsageError: (a ``ValueError``) bad flag values, before any work (unknown device spec or
            model, a card the topology's boxes do not hold, non-positive sizes, a compile-mode
            bucket cap below torch's first bucket, a flag that does not apply to a model
            factory, a factory that does not return ``(model, inputs, loss_fn)``).
    """
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(message)s")
    try:
        factory, kind, condition, dead = _check(args)
        device = hpu.reset_device(args.device_spec)  # a malformed PT_HPU_* / HPU_* variable raises here
    except ValueError as exc:  # bad input, found before any work: the command line's error
        raise UsageError(str(exc)) from exc
    if args.trace:
        device.enable_trace()
    rank, world = _init_distributed(args.backend, args.pg_timeout)

    torch.manual_seed(args.seed)
    step = None
    if factory is not None:  # built as the tracer builds it: on the card, its inputs then taken as host batches
        with torch.device("hpu"):
            step = factory(args.batch_size)
        step = step._replace(inputs=tuple(t.cpu() for t in step.inputs))
    built = step.model if step is not None else build_model(args.model, args.flavour, hidden=args.hidden)
    # hpu_graphs: the model in ModuleCacher before DDP wraps it (the tracer does the same)
    model = prepare_model(built.to("hpu"), args.mode)
    ddp = DDP(
        model,
        bucket_cap_mb=args.bucket_cap_mb,
        gradient_as_bucket_view=args.gradient_as_bucket_view,
        static_graph=args.static_graph,
        # no buffer sync in forward, as Habana's ResNet scripts do (broadcast_buffers=False, which
        # torch 2.13 deprecates with a warning per rank); buffers are still synced once at init
        forward_sync_buffers=False,
    )
    stepped = torch.compile(ddp, backend="hpu_backend") if args.mode == "compile" else ddp
    if args.optimizer == "adam":
        opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    else:  # the tracer's optimizers (sgd: momentum SGD), so a study plans what runs here
        opt = make_optimizer(args.optimizer, [(n, q) for n, q in model.named_parameters() if q.requires_grad],
                             args.lr, args.momentum)
    sampler = None
    if step is None:
        train_set, test_set = load_dataset(args.dataset, seed=args.seed, image_size=args.image_size,
                                           seq_len=args.seq_len, vocab_size=kind.vocab_size)
        sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
        loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    device.begin_step()

    epochs = []
    total_steps = 0
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
            steps_iter = _dataset_steps(loader, kind.task)
        else:  # a model factory: its one batch, every step
            steps_iter = itertools.repeat((step.inputs, step.loss_fn), args.max_steps or FACTORY_EPOCH_STEPS)
        wall0 = time.perf_counter()
        losses: list[torch.Tensor] = []
        steps = 0
        sim = {"step_ns": 0, "compute_ns": 0, "comm_ns": 0, "exposed_comm_ns": 0, "host_ns": 0}
        step_ns: list[int] = []
        step_times: list[dict] = []
        step_ends: list[int] = []  # when each step's window closed (the job's steps: NOTE [the job's step])
        for inputs, loss_fn in steps_iter:
            if args.max_steps and steps >= args.max_steps:
                break
            if dead == (rank, total_steps):  # --dead-rank: this process dies (NOTE [a dead rank], hccl.sim.whatif)
                log.error("rank %d: --dead-rank %d@%d: exiting at step %d", rank, rank, total_steps, total_steps)
                logging.shutdown()
                os._exit(DEAD_RANK_EXIT)
            total_steps += 1
            # the same step the tracer times (hpu_runtime.tools.tracing): inputs copied to the
            # device, forward + loss, backward, mark_step, optimizer, mark_step
            losses.append(training_step(stepped, inputs, loss_fn, opt, autocast=args.autocast))
            t = device.end_step()
            step_ends.append(device.now_ns())
            if condition.active and total_steps == cluster.ALIGN_STEP:
                dist.barrier()  # ranks and hosts aligned once, as the planner does (hccl.sim.straggler_plan)
            for k in sim:
                sim[k] += getattr(t, k)
            step_ns.append(t.step_ns)
            step_times.append(asdict(t))
            steps += 1
        train_loss = torch.stack(losses).mean().item() if losses else float("nan")
        metrics = _evaluate(ddp.module, test_set, kind, args) if step is None else {}  # a factory has no held-out set
        wall_s = time.perf_counter() - wall0
        row = {
            "epoch": epoch,
            "steps": steps,
            "train_loss": train_loss,
            **metrics,
            "sim_step_ns_mean": sim["step_ns"] // max(steps, 1),
            "sim_step_ns_median": int(statistics.median(step_ns)) if step_ns else 0,
            "sim_compute_ns_mean": sim["compute_ns"] // max(steps, 1),
            "sim_comm_ns_mean": sim["comm_ns"] // max(steps, 1),
            "sim_exposed_comm_ns_mean": sim["exposed_comm_ns"] // max(steps, 1),
            "sim_host_ns_mean": sim["host_ns"] // max(steps, 1),
            "sim_epoch_ns": sim["step_ns"],
            "wall_epoch_s": wall_s,
            "sim_steps": step_times,
        }
        if condition.active and step_ends:
            row["sim_job_steps"] = _job_steps(step_ends, step_ns[0], world)
        epochs.append(row)
        device.begin_step()  # evaluation is not part of any training step
        if rank == 0:
            log.info(
                "epoch %d  loss %.4f  %s | simulated step %.1f us mean, %.1f us median"
                " (mean compute %.1f, comm %.1f, exposed comm %.1f, host %.1f) | wall-clock epoch %.2f s",
                epoch,
                train_loss,
                "  ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in metrics.items()),
                row["sim_step_ns_mean"] / 1e3,
                row["sim_step_ns_median"] / 1e3,
                row["sim_compute_ns_mean"] / 1e3,
                row["sim_comm_ns_mean"] / 1e3,
                row["sim_exposed_comm_ns_mean"] / 1e3,
                row["sim_host_ns_mean"] / 1e3,
                wall_s,
            )
            if "sim_job_steps" in row:  # the cluster varies: the latest rank sets the job's pace
                job = row["sim_job_steps"]
                log.info("epoch %d  the job's simulated step (its latest rank's): %.1f us mean",
                         epoch, sum(job) / len(job) / 1e3)

    pg = dist.group.WORLD
    history = getattr(pg, "history", [])
    summary = {
        "config": vars(args) | {"world_size": world},
        "device_spec": asdict(device.spec),
        "epochs": epochs,
        "final": {
            "train_loss": epochs[-1]["train_loss"],
            **{k: epochs[-1][k] for k in metrics},
            "sim_total_ns": sum(e["sim_epoch_ns"] for e in epochs),
            "wall_total_s": sum(e["wall_epoch_s"] for e in epochs),
            "collectives": len(history),
            "ddp_buckets": _bucket_count(ddp),
        },
        "units": {"sim_*_ns": "simulated Gaudi nanoseconds", "wall_*_s": "wall-clock seconds on this machine"},
    }
    if rank == 0 and args.summary:
        with atomic_open(args.summary) as f:  # NOTE [atomic files]: a kill leaves the old summary
            json.dump(summary, f, indent=2, default=str)
        log.info("summary written to %s", args.summary)
    if args.trace:
        from hpu_runtime.api.trace import merge_trace_files, rank_trace_path, write_rank_trace

        write_rank_trace(args.trace, rank, device.trace_events(rank))
        dist.barrier()
        if rank == 0:
            merged = merge_trace_files(os.path.join(args.trace, "trace.json"),
                                       [rank_trace_path(args.trace, r) for r in range(world)])
            log.info("trace written to %s", merged)
    del stepped, ddp  # NOTE [the group outlives DDP]
    gc.collect()
    dist.destroy_process_group()
    return summary


def _job_steps(step_ends: list[int], first_step_ns: int, world: int) -> list[int]:
    """The job's steps of this epoch (simulated ns; NOTE [the job's step] in
    :mod:`hccl.sim.straggler_plan`): every rank's step ends gathered (an int64 all_gather,
    after the epoch's steps), then per step the increase of the latest. Every rank must call it.

    Raises:
        ValueError: ranks that ran different numbers of steps (``--max-steps`` or data shards).
    """
    from hccl.sim.straggler_plan import job_steps_ns

    mine = torch.tensor([step_ends[0] - first_step_ns, *step_ends], dtype=torch.int64)
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(counts, torch.tensor([mine.numel()], dtype=torch.int64))
    if len({int(c) for c in counts}) > 1:
        raise ValueError(f"the ranks ran different numbers of steps this epoch: {[int(c) - 1 for c in counts]}")
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    rows = [t.tolist() for t in every]
    return job_steps_ns([r[1:] for r in rows], starts=[r[0] for r in rows])


def _bucket_count(ddp: DDP) -> int | None:
    try:
        return int(ddp._get_ddp_logging_data().get("num_buckets_reduced", 0)) or None
    except Exception:
        return None


if __name__ == "__main__":
    try:
        main()
    except UsageError as exc:  # as argparse reports a bad flag: the message and exit code 2, no traceback
        build_parser().exit(2, f"python -m models.train: error: {exc}\n")
