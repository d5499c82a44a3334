"""Simulated vs published Gaudi training figures, side by side: ``python -m models.bench_fidelity``.

Each published figure (``models/published_figures.toml``) is planned the way its run
executed (:mod:`models.published_runs`: the mode, micro-batch, packing, accumulation,
optimizer and all-reduce of the run's own launch script), on the device model calibrated in
:mod:`models.calibration`.

Tables (simulated times are per card, per optimizer step, simulated ms):

1. per-card throughput, published and simulated, with the step split into device-only
   time (the compute stream busy), host-only time (the host thread busy) and exposed
   communication, so a reader sees what bounds each row, and the micro-step's simulated HBM
   peak against the card's (every published run fits where it trained);
2. scaling efficiency between card counts;
3. the host time per step of the seed "HPU Graphs for Training" MNIST ``Net`` (batch 200,
   Adadelta, first-gen Gaudi) without HPU graphs, with ``make_graphed_callables`` and with
   capture/replay;
4. the calibrated constants (NOTE [calibration] in :mod:`hpu_runtime.device.spec`): each
   constant, the figure it was fitted on and its residual there; every other row of table
   1 is a prediction, and its ratio is the residual. ``--refit`` fits them again from
   scratch and prints the values beside the spec's.

Simulated times are deterministic; the wall-clock the benchmark takes is printed last.
"""

from __future__ import annotations

import argparse
import time

from tabulate import tabulate

from .calibration import CONSTANTS, SEED_HOST_MS, fit_device_constants, fit_host_constants, seed_host_ms
from .published_runs import ROWS, Row, load_figures, published_figure, simulate_row

__all__ = ["main", "throughput_table"]


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.1f}"


def throughput_table(figures: list[dict], cache: dict) -> tuple[list, dict]:
    """Table 1's rows and ``{row index: (published, RowResult)}``."""
    from hpu_runtime.device.memory import HPUOutOfMemoryError
    from hpu_runtime.device.spec import get_device_spec

    role = {c.row: f"fit: {c.field}" for c in CONSTANTS}
    rows, results = [], {}
    for i, row in enumerate(ROWS):
        fig = published_figure(figures, row)
        if fig is None:
            continue
        pub = fig["throughput_samples_per_s"] / (1 if fig.get("per_card") else row.cards)
        head = [row.model + (f"@{row.seq_len}" if row.seq_len else ""), row.device, row.cards, row.batch,
                row.ran_in, row.mode, _traced(row)]
        try:
            r = simulate_row(row, cache)
        except HPUOutOfMemoryError as exc:
            rows.append([*head, f"{pub:,.0f}", "HBM OOM", "-", "-", "-", "-", "-", "-", "-", "-", role.get(i, "check")])
            print(f"  {row.label}: {exc}")
            continue
        results[i] = (pub, r)
        bound = "device" if r.device_ns >= max(r.host_ns, r.exposed_comm_ns) else (
            "host" if r.host_ns >= r.exposed_comm_ns else "comm")
        hbm = f"{r.peak_hbm_bytes / 2**30:.0f}/{get_device_spec(row.device).hbm_bytes / 2**30:.0f}"
        rows.append([*head, f"{pub:,.0f}", f"{r.samples_per_s:,.0f}", f"{r.samples_per_s / pub:.2f}", _ms(r.step_ns),
                     _ms(r.device_ns), _ms(r.host_ns), _ms(r.exposed_comm_ns), _ms(r.checkpoint_ns) if r.checkpoint_ns
                     else "-", bound, hbm, role.get(i, "check")])
    return rows, results


def _traced(row: Row) -> str:
    out = f"{row.micro_batch}"
    if row.accumulation > 1:
        out += f" x{row.accumulation}"
    if row.samples_per_sequence != 1.0:
        out += f" (x{row.samples_per_sequence:g} packed)"
    return out


def _scaling(results: dict) -> list:
    eff = []
    for i, (pub, r) in results.items():
        row = ROWS[i]
        if row.cards == 8:
            continue
        base = next((j for j, (p, q) in results.items() if ROWS[j].cards == 8 and (ROWS[j].model, ROWS[j].device,
                     ROWS[j].seq_len, ROWS[j].software) == (row.model, row.device, row.seq_len, row.software)), None)
        if base is None:
            continue
        bp, br = results[base]
        batches = f"{ROWS[base].batch}" if ROWS[base].batch == row.batch else f"{ROWS[base].batch} -> {row.batch}"
        eff.append([row.model, row.device, row.seq_len or "-", f"8 -> {row.cards}", batches, f"{pub / bp:.3f}",
                    f"{r.samples_per_s / br.samples_per_s:.3f}",
                    f"{(r.samples_per_s / br.samples_per_s - pub / bp) * 100:+.1f}"])
    return sorted(eff, key=str)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m models.bench_fidelity", description=__doc__.split("\n\n")[0])
    p.add_argument("--skip-host", action="store_true", help="leave out the seed host-time table")
    p.add_argument("--refit", action="store_true",
                   help="fit the calibrated constants again from scratch and print them beside the spec's (minutes)")
    p.add_argument("--skip-scaling", action="store_true",
                   help="leave out the scaling table of published series (models.bench_scaling)")
    args = p.parse_args(argv)
    from hpu_runtime.device.spec import get_device_spec

    wall0 = time.perf_counter()
    figures = load_figures()
    cache: dict = {}
    rows, results = throughput_table(figures, cache)
    print("Per-card training throughput (samples/s per card; simulated: bf16, the published run's mode, micro-batch,"
          " packing, accumulation,\noptimizer and all-reduce; times per card per optimizer step, simulated ms; ckpt:"
          " the published block's checkpoint, its share per step\n(NOTE [a block's checkpoint] in"
          " models/published_runs.py); HBM: the micro-step's simulated peak / the card's, GiB)")
    print(tabulate(rows, headers=["model", "device", "cards", "batch", "published run", "planned", "traced",
                                  "published", "simulated", "ratio", "step", "device", "host", "exposed comm",
                                  "ckpt", "bound", "HBM", "role"], tablefmt="github"))
    print("\nScaling efficiency (per-card throughput at N cards / at 8 cards)")
    print(tabulate(_scaling(results), headers=["model", "device", "seq", "cards", "batch/card", "published",
                                               "simulated", "points"], tablefmt="github"))
    if not args.skip_host:
        sim = seed_host_ms()
        print("\nHost time per step, seed MNIST Net (batch 200, Adadelta, first-gen Gaudi), ms")
        print(tabulate([[k, SEED_HOST_MS[k], f"{sim[k]:.2f}", f"{sim[k] / SEED_HOST_MS[k]:.2f}"] for k in SEED_HOST_MS],
                       headers=["variant", "published", "simulated", "ratio"], tablefmt="github"))
    consts = [[c.name, getattr(get_device_spec(c.devices[0]), c.field), ROWS[c.row].label,
               f"{results[c.row][1].samples_per_s / results[c.row][0]:.3f}" if c.row in results else "-"]
              for c in CONSTANTS]
    gen1 = get_device_spec("gaudi")
    consts += [[f"{name} (every generation)", getattr(gen1, name), "seed host times (3 variants, exact)", "table 3"]
               for name in ("host_op_ns", "graph_launch_ns", "h2d_copy_ns")]
    fitted_rows = {c.row for c in CONSTANTS}
    checks = [r.samples_per_s / pub for i, (pub, r) in results.items() if i not in fitted_rows]
    print("\nCalibrated constants (NOTE [calibration] in hpu_runtime/device/spec.py)")
    print(tabulate(consts, headers=["constant", "value", "fitted on", "ratio there"], tablefmt="github"))
    if checks:
        print(f"Residuals on the {len(checks)} other rows (simulated / published): "
              f"{min(checks):.2f} .. {max(checks):.2f}")
    if args.refit:
        print("\nRefit from scratch (device constants jointly, by bisection; host constants exactly):")
        device = fit_device_constants(cache=cache)
        host = fit_host_constants()
        table = [[c.name, v, getattr(get_device_spec(c.devices[0]), c.field)] for c, v in device.items()]
        table += [[name, v, getattr(gen1, name)] for name, v in host.items()]
        print(tabulate(table, headers=["constant", "refit", "spec"], tablefmt="github"))
    if not args.skip_scaling:
        from .bench_scaling import print_table, scaling_rows

        print_table(scaling_rows())
    print(f"\n(wall-clock {time.perf_counter() - wall0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
