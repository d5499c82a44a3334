"""Study CLIs over traced steps: ``python -m launchers.study trace|bucket ...``.

``bucket`` is the bucket-size study (:mod:`launchers.bucket_study`)::

    python -m launchers.study bucket --model resnet50 --batch-size 256 \\
        --world-sizes 8,64,512 --bucket-cap-mb 1,2,5,10,25,50,100 --topology hls2 --out study/


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
The mode follows ``PT_HPU_LAZY_MODE`` (1: lazy, 0: eager) unless ``--mode`` says
``lazy``, ``eager`` or ``compile``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from hpu_runtime.cli_args import count, real

__all__ = ["main", "build_parser", "trace_json", "bucket_main"]


_size = count(1, 1 << 20)
_ranks = count(1, 1 << 24, "ranks")
_pixels = count(8, 8192, "pixels")
_mb = real(0.0, 1e6, "MB", lo_open=True)


def _env_mode() -> str:
    raw = os.environ.get("PT_HPU_LAZY_MODE", "1").strip() or "1"
    if raw not in ("0", "1"):
        raise SystemExit(f"PT_HPU_LAZY_MODE={raw!r} must be 0 or 1")
    return "lazy" if raw == "1" else "eager"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    """The model flags every study command shares."""
    p.add_argument("--model", required=True,
                   help="registered name (name:flavour for a flavour) or package.module:factory")
    p.add_argument("--batch-size", type=_size, required=True, help="per-card batch")
    p.add_argument("--seq-len", type=_size, default=None, help="tokens per sample (text models)")
    p.add_argument("--image-size", type=_pixels, default=None, help="pixels per side (image models)")


def build_parser() -> argparse.ArgumentParser:
    from hpu_runtime.device.spec import DEVICE_SPECS
    from hpu_runtime.tools.tracing import MODES, OPTIMIZERS

    p = argparse.ArgumentParser(prog="python -m launchers.study", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("trace", help="trace one training step without data; print a summary, write JSON")
    _add_model_args(t)
    t.add_argument("--device-spec", default="gaudi2", choices=sorted(DEVICE_SPECS))
    t.add_argument("--mode", default=None, choices=MODES, help="default: PT_HPU_LAZY_MODE (1 lazy, 0 eager)")
    t.add_argument("--optimizer", default="sgd", choices=list(OPTIMIZERS),
                   help="torch's sgd/adamw, or Gaudi's fused hpex optimizers (one kernel per group)")
    t.add_argument("--precision", default="bf16", choices=["bf16", "fp32"],
                   help="bf16 (default): forward and loss under bf16 autocast, as Habana's --autocast"
                        " recipes train these models; fp32: no autocast")
    t.add_argument("--bucket-cap-mb", type=_mb, default=None,
                   help="also give DDP's buckets for this bucket_cap_mb and the planned DDP step")
    t.add_argument("--first-bucket-mb", type=_mb, default=None,
                   help="dist._DEFAULT_FIRST_BUCKET_BYTES in MB (torch uses it only with the default cap)")
    t.add_argument("--gradient-as-bucket-view", action="store_true")
    t.add_argument("--world-size", type=_ranks, default=8, help="ranks for the planned DDP step")
    t.add_argument("--topology", default="hls2", help="hls1, hls2, hls3 or a topology file")
    t.add_argument("--json", default=None, metavar="PATH", help="write the JSON here")
    _add_bucket_parser(sub)
    return p


def _list(kind, name: str):
    def parse(text: str) -> tuple:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"{name}: empty list")
        return tuple(kind(t) for t in items)
    return parse


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def _first_mb(text: str) -> float | None:
    return None if text.strip().lower() in ("default", "none") else _mb(text)


def _add_bucket_parser(sub) -> None:
    from hpu_runtime.device.spec import DEVICE_SPECS

    b = sub.add_parser("bucket", help="which bucket_cap_mb at which scale: table, plot, recommendation")
    _add_model_args(b)
    b.add_argument("--world-sizes", type=_list(_ranks, "--world-sizes"), default=(8,))
    b.add_argument("--bucket-cap-mb", type=_list(_mb, "--bucket-cap-mb"),
                   default=(1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0))
    b.add_argument("--topology", type=_list(str, "--topology"), default=("hls2",),
                   help="hls1, hls2, hls3 or topology files, comma-separated")
    b.add_argument("--first-bucket-mb", type=_list(_first_mb, "--first-bucket-mb"), default=(None,),
                   help="dist._DEFAULT_FIRST_BUCKET_BYTES in MB ('default' = 1 MB); torch 2.13 uses it"
                        " only with DDP's default cap")
    b.add_argument("--comm-hook", type=_list(str, "--comm-hook"), default=("none",), help="none, fp16, bf16")
    b.add_argument("--lazy-collectives", type=_list(_bool, "--lazy-collectives"), nargs="?",
                   const=(True,), default=(False,), help="PT_HPU_ENABLE_LAZY_COLLECTIVES: false,true")
    b.add_argument("--gradient-as-bucket-view", type=_list(_bool, "--gradient-as-bucket-view"), nargs="?",
                   const=(True,), default=(False,))
    b.add_argument("--static-graph", type=_list(_bool, "--static-graph"), nargs="?", const=(True,), default=(False,))
    b.add_argument("--mode", type=_list(str, "--mode"), default=None, help="lazy, eager, compile (default:"
                   " PT_HPU_LAZY_MODE)")
    b.add_argument("--device-spec", type=_list(str, "--device-spec"), default=("gaudi2",),
                   help=f"{', '.join(sorted(DEVICE_SPECS))}")
    b.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    b.add_argument("--out", required=True, metavar="DIR", help="study.csv, study.json, study.png, recommendation.md")
    b.add_argument("--live", action="store_true",
                   help="also run the points whose world size fits this machine as real DDP jobs")
    b.add_argument("--live-max-ranks", type=count(1, 4096, "ranks"), default=None,
                   help="largest world size run live (default: this machine's cores)")
    b.add_argument("--launcher", default="torchrun", choices=["torchrun", "ray"], help="for --live")
    b.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="plan the points as Ray tasks (an embedded cluster, or ADDRESS)")
    b.add_argument("--sweep-only", action="store_true",
                   help="leave out the settings in the wild (DDP default, Gaudi docs, Habana scripts, one bucket)")
    b.add_argument("--no-progress", action="store_true")


def bucket_main(args: argparse.Namespace) -> dict:
    """Run the ``bucket`` command; returns ``{"rows", "recommendation", "paths"}``.

    Raises:
        ValueError: bad input, before any work starts (:func:`bucket_study.run_study`
            validates first).
    """
    from . import bucket_study as bs

    cfg = bs.StudyConfig(
        model=args.model, batch_size=args.batch_size, seq_len=args.seq_len, image_size=args.image_size,
        world_sizes=args.world_sizes,
        bucket_caps_mb=args.bucket_cap_mb, topologies=args.topology, first_bucket_mb=args.first_bucket_mb,
        comm_hooks=args.comm_hook, lazy_collectives=args.lazy_collectives,
        gradient_as_bucket_view=args.gradient_as_bucket_view, static_graph=args.static_graph,
        modes=args.mode or (_env_mode(),), device_specs=args.device_spec, precision=args.precision,
        in_the_wild=not args.sweep_only)
    rows = bs.run_study(cfg, use_ray=args.ray is not None, ray_address=args.ray or None,
                        progress=not args.no_progress)
    if args.live:
        limit = args.live_max_ranks or (os.cpu_count() or 1)
        for row in rows:
            if row["world_size"] <= limit and row["mode"] != "compile":
                row["live_step_ns"] = bs.live_step_ns(cfg, row, launcher=args.launcher)
    recs = bs.recommend(rows)
    paths = bs.write_outputs(args.out, cfg, rows, recs)
    return {"rows": rows, "recommendation": recs, "paths": paths}


def trace_json(args: argparse.Namespace) -> dict:
    """Trace and summarise as the ``trace`` command does; returns the JSON-ready dict.

    Raises:
        ValueError: a bad model spec, size, topology or world size (message names it).
    """
    from hccl.sim.ddp_plan import ddp_buckets, plan_ddp_step
    from hpu_runtime.device.spec import get_device_spec
    from hpu_runtime.tools.replay import summarize
    from hpu_runtime.tools.tracing import trace_step
    from models.zoo import resolve_factory

    kwargs = {k: v for k, v in (("seq_len", args.seq_len), ("image_size", args.image_size)) if v is not None}
    factory = resolve_factory(args.model, **kwargs)
    mode = args.mode or _env_mode()
    trace = trace_step(factory, args.batch_size, spec=get_device_spec(args.device_spec), mode=mode,
                       lazy_collectives=_env_flag("PT_HPU_ENABLE_LAZY_COLLECTIVES"), optimizer=args.optimizer,
                       autocast=args.precision == "bf16")
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


def _print_bucket(result: dict) -> None:
    rows = result["rows"]
    from tabulate import tabulate

    from . import bucket_study as bs

    live = any("live_step_ns" in r for r in rows)
    table = [[r["world_size"], r["setting"] if r["setting"] != "sweep" else "", f"{r['bucket_cap_mb']:g}",
              r["num_buckets"], r["graph_launches"], f"{r['step_ns'] / 1e6:.3f}", f"{r['exposed_comm_ns'] / 1e6:.3f}",
              f"{r['samples_per_s_per_card']:,.0f}"] + ([f"{r['live_step_ns'] / 1e6:.3f}" if "live_step_ns" in r
                                                         else ""] if live else [])
             for r in rows]
    headers = ["cards", "setting", "cap MB", "buckets", "launches", "step ms", "exposed ms", "samples/s/card"]
    print(tabulate(table, headers=headers + (["live step ms"] if live else []), tablefmt="github"))
    print()
    for r in result["recommendation"]:
        print(f"{r['world_size']} cards ({r['mode']}, {r['topology']}): best bucket_cap_mb={r['best_bucket_cap_mb']:g},"
              f" {bs.gain_text(r)}. {r['why']}")
    print("\nwritten: " + ", ".join(str(p) for p in result["paths"].values()))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "bucket":
            _print_bucket(bucket_main(args))
            return 0
        out = trace_json(args)
    except (ValueError, NotImplementedError) as exc:
        print(f"launchers.study {args.command}: error: {exc}", file=sys.stderr)
        return 2
    _print_summary(out)
    if args.json:
        from hpu_runtime.files import atomic_open

        with atomic_open(args.json) as f:  # NOTE [atomic files]
            json.dump(out, f, indent=1)
        print(f"  JSON written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
