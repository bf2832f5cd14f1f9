"""`dilu simulate`: the policy comparison on a simulated fleet (``dilu.sim``), with a progress bar."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.common import err, out


def simulate(
    workload: Annotated[str,
                        typer.Option(help="Instance workload: instances-{100,...,3200} or a file")] = "instances-3200",
    trace: Annotated[str, typer.Option(help="Request arrivals: azure-code, azure-conv, bursty, periodic, sporadic, "
                                            "poisson:RATE, gamma:RATE:CV, or a file")] = "bursty",
    policy: Annotated[str, typer.Option(help="Comma-separated policies, or all")] = "all",
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for metrics.json, CSVs and plots")] = Path("sim-out"),
    nodes: Annotated[int, typer.Option(min=1, max=100_000)] = 1000,
    replicate: Annotated[int, typer.Option(min=1, max=100, help="Run the workload this many times over, at the "
                                           "same times (with --nodes that many times larger: a larger fleet)")] = 1,
    gpus_per_node: Annotated[int, typer.Option(min=1, max=64)] = 4,
    gpu_memory_gb: Annotated[float, typer.Option(min=1)] = 40.0,
    serving_gpus: Annotated[int, typer.Option(min=1, max=4096, help="GPUs of the request-serving scenario")] = 8,
    trainings: Annotated[int, typer.Option(min=0, max=4096, help="Training jobs beside the inference functions")] = 4,
    load: Annotated[float, typer.Option(min=0.01, max=100, help="Busy-second demand per function, in instances "
                                                                "at the profiled request share")] = 0.7,
    cold_start_s: Annotated[float, typer.Option(min=0, max=3600, help="Measured cold-start cost")] = 5.0,
    duration_s: Annotated[float | None, typer.Option(min=1, max=604_800, help="Serving time simulated (default: the "
                                                     "trace; a rate trace repeats), at most a week")] = None,
    tick_s: Annotated[float, typer.Option(min=0.005, max=1.0)] = 0.1,
    price: Annotated[float, typer.Option(min=0, help="Price of one GPU-hour, for the cost column")] = 2.0,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Compare Dilu with the baselines on a trace-driven simulated fleet, using the live policy code."""
    from dilu.sim.placement import peak_bound
    from dilu.sim.policies import parse_policies
    from dilu.sim.report import format_table, run_all, write
    from dilu.sim.serving import ServingSetup
    from dilu.sim.traces import TraceError, load_trace
    from dilu.sim.workload import WorkloadError, load_workload
    from dilu.sim.workload import replicate as replicated

    try:
        names = parse_policies(policy)
        events = replicated(load_workload(workload), replicate)
        arrivals = load_trace(trace, duration_s=duration_s, seed=seed)
    except (ValueError, TraceError, WorkloadError, OSError) as exc:
        err.print(f"error: {exc}", highlight=False)
        raise typer.Exit(1) from None
    if len(arrivals) < 2:
        err.print(f"error: trace {trace!r} has fewer than two arrivals in the time simulated", highlight=False)
        raise typer.Exit(1)
    serving = ServingSetup(arrivals=arrivals, load=load, gpus=serving_gpus, trainings=trainings, tick_s=tick_s,
                           cold_start_s=cold_start_s, duration_s=duration_s, gpu_memory_gb=gpu_memory_gb,
                           gpus_per_node=gpus_per_node)
    serving_seconds = duration_s or float(arrivals[-1])
    with Progress(TextColumn("{task.description:<22}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), console=err, transient=False) as progress:
        tasks = {name: progress.add_task(name, total=len(events) + serving_seconds) for name in names}
        runs = run_all(names, events, serving, nodes=nodes, gpus_per_node=gpus_per_node, gpu_memory_gb=gpu_memory_gb,
                       advance=lambda name, units: progress.advance(tasks[name], units))
    context = {"workload": workload, "trace": trace, "nodes": nodes, "gpus_per_node": gpus_per_node,
               "gpu_memory_gb": gpu_memory_gb, "serving_gpus": serving_gpus, "trainings": trainings, "load": load,
               "cold_start_s": cold_start_s, "tick_s": tick_s, "price_per_gpu_hour": price, "seed": seed,
               "serving_seconds": serving_seconds, "replicate": replicate}
    bound = peak_bound(events, gpu_memory_gb)
    context["peak_gpus_bound"] = {"gpus": bound.gpus, "at_s": bound.at_s, "over_half_memory": bound.over_half_memory,
                                  "by_memory": bound.by_memory, "by_compute": bound.by_compute}
    table = write(runs, out_dir, price, context)
    rows = format_table(table)
    shown = Table(*rows[0],
                  title=f"{workload} on {nodes} x {gpus_per_node} GPUs; serving: {trace} on {serving_gpus} GPUs")
    for row in rows[1:]:
        shown.add_row(*row)
    out.print(shown)
    out.print(f"no placement needs fewer than {bound.gpus} GPUs at the peak (t={bound.at_s:.0f}s): "
              f"{bound.over_half_memory} GPU slots hold over half a GPU's memory each; all memory fills "
              f"{bound.by_memory}, all compute requested {bound.by_compute}", highlight=False)
    out.print(f"wrote {out_dir}/metrics.json, metrics.csv, placement_timeseries.csv and plots", highlight=False)
