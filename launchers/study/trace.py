"""The ``trace`` command: one training step traced without data, summarised, written as JSON.

``trace`` traces ONE training step (forward, backward, optimizer) of a model at full size
without data (:func:`hpu_runtime.tools.tracing.trace_step`: FakeTensorMode under the same bridge
and cost model as a live run), prints a short summary and writes JSON::

    python -m launchers.study trace --model bert-large --batch-size 64 --seq-len 512 \\
        --device-spec gaudi2 --json OUT.json [--bucket-cap-mb 25]

JSON keys (simulated ns unless named ``*_bytes`` or ``wall_*_s``): ``step_ns``,
``forward_ns``, ``backward_ns``, ``optimizer_ns``, ``host_ns``, ``peak_hbm_bytes``,
``graphs`` (per launched graph: ``reason``, ``ops``, ``device_ns``), ``params`` (per
trainable parameter in DDP's order: ``name``, ``bytes``, ``grad_ready_ns`` from the step's
start); with ``--bucket-cap-mb`` also ``buckets`` (DDP's rebuilt buckets in reduction
order: ``bytes``, ``ready_ns``, ``params``) and ``planned`` (the DDP step on
``--world-size`` ranks of ``--topology``, :func:`hccl.sim.ddp_plan.plan_ddp_step`).

``--model`` is a registered name (``mlp``, ``resnet50``, ``resnext101``, ``bert-large``,
``gpt2``; ``name:flavour`` for a flavour such as ``resnet50:debug``) or
``package.module:factory`` for your own model, where ``factory(batch_size)`` returns
``(model, inputs, loss_fn)`` and one step is ``loss_fn(model(*inputs)).backward()``.
The mode follows ``PT_HPU_LAZY_MODE`` (1: lazy, 0: eager) unless ``--mode`` names one of
:data:`hpu_runtime.tools.tracing.MODES`; in ``compile`` mode with ``--bucket-cap-mb`` the model
is compiled as ``torch.compile(DDP(model))`` compiles it, broken by DDPOptimizer at that cap.
"""

from __future__ import annotations

import argparse
import json

from ._args import add_model_args, env_flag, env_mode, mb, ranks

__all__ = ["add_parser", "trace_json", "run"]


def add_parser(sub) -> None:
    """Add the ``trace`` subcommand to ``sub`` (an argparse subparsers object)."""
    from hpu_runtime.device.spec import DEVICE_SPECS
    from hpu_runtime.tools.tracing import MODES, OPTIMIZERS

    t = sub.add_parser("trace", help="trace one training step without data; print a summary, write JSON")
    add_model_args(t)
    t.add_argument("--device-spec", default=None, choices=sorted(DEVICE_SPECS),
                   help="default: the --topology's card, else gaudi2")
    t.add_argument("--mode", default=None, choices=MODES, help="default: PT_HPU_LAZY_MODE (1 lazy, 0 eager);"
                   " compile with --bucket-cap-mb: the graph broken at DDP's buckets, as under DDP")
    t.add_argument("--optimizer", default="sgd", choices=list(OPTIMIZERS),
                   help="torch's sgd/adamw, or Gaudi's fused hpex optimizers (one kernel per group)")
    t.add_argument("--precision", default="bf16", choices=["bf16", "fp32"],
                   help="bf16 (default): forward and loss under bf16 autocast, as Habana's --autocast"
                        " recipes train these models; fp32: no autocast")
    t.add_argument("--bucket-cap-mb", type=mb, default=None,
                   help="also give DDP's buckets for this bucket_cap_mb and the planned DDP step")
    t.add_argument("--first-bucket-mb", type=mb, default=None,
                   help="dist._DEFAULT_FIRST_BUCKET_BYTES in MB (torch uses it only with the default cap)")
    t.add_argument("--gradient-as-bucket-view", action="store_true")
    t.add_argument("--world-size", type=ranks, default=8, help="ranks for the planned DDP step")
    t.add_argument("--topology", default=None, help="hls1, hls2, hls3 or a topology file (default: the box of the"
                   " --device-spec card, else hls2)")
    t.add_argument("--json", default=None, metavar="PATH", help="write the JSON here")


def trace_json(args: argparse.Namespace) -> dict:
    """Trace and summarise as the ``trace`` command does; returns the JSON-ready dict.

    Raises:
        ValueError: a bad model spec, size, topology or world size (message names it).
    """
    from hccl.sim.ddp_plan import ddp_buckets, plan_ddp_step
    from hccl.sim.topology import device_and_topology
    from hpu_runtime.device.spec import get_device_spec
    from hpu_runtime.tools.replay import summarize
    from hpu_runtime.tools.tracing import trace_step
    from models.zoo import resolve_factory

    # a box holds cards of one generation: the setting not given follows the other
    args.device_spec, args.topology = device_and_topology(args.device_spec, args.topology, device_from="--device-spec",
                                                          topology_from="--topology")
    kwargs = {k: v for k, v in (("seq_len", args.seq_len), ("image_size", args.image_size)) if v is not None}
    factory = resolve_factory(args.model, **kwargs)
    mode = args.mode or env_mode()
    ddp = mode == "compile" and args.bucket_cap_mb is not None  # compiled as torch.compile(DDP(model)) is
    trace = trace_step(factory, args.batch_size, spec=get_device_spec(args.device_spec), mode=mode,
                       lazy_collectives=env_flag("PT_HPU_ENABLE_LAZY_COLLECTIVES"), optimizer=args.optimizer,
                       autocast=args.precision == "bf16", ddp_bucket_cap_mb=args.bucket_cap_mb if ddp else None,
                       ddp_first_bucket_mb=args.first_bucket_mb if ddp else None)
    s = summarize(trace)
    out = {
        "model": args.model, "batch_size": args.batch_size, "seq_len": args.seq_len,
        "image_size": args.image_size, "device_spec": args.device_spec, "mode": mode,
        "precision": args.precision,
        "step_ns": s.times.step_ns, "forward_ns": s.forward_ns, "backward_ns": s.backward_ns,
        "optimizer_ns": s.optimizer_ns, "host_ns": s.times.host_ns, "compute_ns": s.times.compute_ns,
        "peak_hbm_bytes": trace.peak_hbm_bytes,
        "graphs": [{"reason": r, "ops": n, "device_ns": ns} for r, n, ns in s.graphs],
        "params": [{"name": p.name, "bytes": p.nbytes, "grad_ready_ns": ns}
                   for p, ns in zip(trace.params, s.grad_ready_ns)],
        "frozen_params": trace.frozen,
        "wall_trace_s": trace.wall_s,
        "units": {"*_ns": "simulated Gaudi nanoseconds", "*_bytes": "bytes", "wall_*_s": "wall-clock seconds"},
    }
    if args.bucket_cap_mb is not None:
        buckets = ddp_buckets(trace, args.bucket_cap_mb, first_bucket_mb=args.first_bucket_mb)
        plan = plan_ddp_step(trace, world_size=args.world_size, topology=args.topology,
                             bucket_cap_mb=args.bucket_cap_mb, first_bucket_mb=args.first_bucket_mb,
                             gradient_as_bucket_view=args.gradient_as_bucket_view)
        ready = {b.params: b.ready_ns for b in plan.buckets}
        out["bucket_cap_mb"] = args.bucket_cap_mb
        out["buckets"] = [{"bytes": b.nbytes, "ready_ns": ready.get(b.params, 0),
                           "params": [trace.params[i].name for i in b.params]} for b in buckets]
        t = plan.times
        out["planned"] = {
            "world_size": args.world_size, "topology": args.topology, "step_ns": t.step_ns,
            "compute_ns": t.compute_ns, "comm_ns": t.comm_ns, "exposed_comm_ns": t.exposed_comm_ns,
            "host_ns": t.host_ns, "graph_launches": plan.graph_launches, "algorithm": plan.algorithm,
            "allreduce": [{"bytes": b.nbytes, "ready_ns": b.ready_ns, "start_ns": b.start_ns, "end_ns": b.end_ns}
                          for b in plan.buckets],
        }
    return out


def _print_summary(out: dict) -> None:
    ms = 1e6
    print(f"{out['model']} batch {out['batch_size']} on {out['device_spec']} ({out['mode']} mode,"
          f" {out['precision']}), one card:"
          f" step {out['step_ns'] / ms:.3f} ms (simulated)")
    print(f"  forward {out['forward_ns'] / ms:.3f} ms, backward {out['backward_ns'] / ms:.3f} ms,"
          f" optimizer {out['optimizer_ns'] / ms:.3f} ms, host {out['host_ns'] / ms:.3f} ms;"
          f" {len(out['graphs'])} graphs, {sum(g['ops'] for g in out['graphs'])} ops;"
          f" peak HBM {out['peak_hbm_bytes'] / 2**30:.2f} GiB;"
          f" {len(out['params'])} parameters, {sum(p['bytes'] for p in out['params']) / 2**20:.1f} MiB of gradients")
    if "planned" in out:
        p = out["planned"]
        print(f"  DDP, bucket_cap_mb {out['bucket_cap_mb']:g}: {len(out['buckets'])} buckets; on {p['world_size']}"
              f" cards of {p['topology']}: step {p['step_ns'] / ms:.3f} ms, comm {p['comm_ns'] / ms:.3f} ms,"
              f" exposed {p['exposed_comm_ns'] / ms:.3f} ms, {p['graph_launches']} graph launches")
    print(f"  traced in {out['wall_trace_s']:.1f} s wall-clock")


def run(args: argparse.Namespace) -> int:
    """Run the ``trace`` command: print the summary, write ``--json``; returns the exit code.

    Raises:
        ValueError: a bad model spec, size, topology or world size (message names it).
    """
    out = trace_json(args)
    _print_summary(out)
    if args.json:
        from hpu_runtime.files import atomic_open

        with atomic_open(args.json) as f:  # NOTE [atomic files]
            json.dump(out, f, indent=1)
        print(f"  JSON written to {args.json}")
    return 0
