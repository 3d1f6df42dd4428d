"""Presenting a bench: a side-by-side table, the raw results as JSON, a PNG plot."""
from __future__ import annotations

import json
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

# The speed targets: the engine's throughput over llama.cpp's on the same workload.
TARGET_SPEEDUP = {"shared-prefix": 2.5, "three-documents": 2.5, "no-sharing": 2.5, "long-decode": 2.5}
BASELINE = "llamacpp"


def speedups(runs: list[dict]) -> dict[tuple[str, str], float]:
    """(workload, system) -> total tokens/s relative to llama.cpp on the same workload."""
    base = {r["workload"]: r["total_tok_s"] for r in runs if r["system"] == BASELINE}
    return {(r["workload"], r["system"]): r["total_tok_s"] / base[r["workload"]]
            for r in runs if base.get(r["workload"])}


def table(result: dict) -> Table:
    t = Table(title="batchinfer bench: throughput and latency (measured runs; warm-up excluded)")
    for col in ("workload", "system", "ok/req", "wall s", "total tok/s", "out tok/s", "vs llama.cpp",
                "TTFT p50/p99 s", "TPOT p50/p99 ms", "prefix hit", "peak RSS MiB"):
        t.add_column(col, justify="left" if col in ("workload", "system") else "right")
    ratio = speedups(result["runs"])
    for r in _sorted(result["runs"]):
        x = ratio.get((r["workload"], r["system"]))
        t.add_row(r["workload"], r["system"], f"{r['requests'] - r['failures']}/{r['requests']}", f"{r['wall_s']:.2f}",
                  f"{r['total_tok_s']:.1f}", f"{r['output_tok_s']:.1f}", "-" if x is None else f"{x:.2f}x",
                  f"{r['ttft_p50_s']:.2f}/{r['ttft_p99_s']:.2f}",
                  f"{_ms(r['tpot_p50_s'])}/{_ms(r['tpot_p99_s'])}", f"{r['prefix_hit_rate']:.0%}",
                  f"{r['peak_rss_mib']:.0f}")
    return t


def compute_table(result: dict) -> Table:
    peak = result["options"]["peak_gflops"]
    t = Table(title=f"achieved compute per phase (useful FLOPs; CPU fp32 peak {peak:.0f} GFLOP/s)")
    for col in ("workload", "system", "prefill s", "prefill GFLOP", "prefill GFLOP/s", "% peak",
                "decode s", "decode GFLOP", "decode GFLOP/s", "% peak"):
        t.add_column(col, justify="left" if col in ("workload", "system") else "right")
    for r in _sorted(result["runs"]):
        if "prefill_s" not in r:
            continue
        t.add_row(r["workload"], r["system"], f"{r['prefill_s']:.2f}", f"{r['prefill_gflop']:.1f}",
                  f"{r['prefill_gflops']:.1f}", f"{r['prefill_pct_peak']:.1f}%", f"{r['decode_s']:.2f}",
                  f"{r['decode_gflop']:.1f}", f"{r['decode_gflops']:.1f}", f"{r['decode_pct_peak']:.1f}%")
    return t


def _sorted(runs: list[dict]) -> list[dict]:
    return sorted(runs, key=lambda r: (r["workload"], r["system"]))


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f}"


def target_lines(result: dict) -> list[str]:
    ratio = speedups(result["runs"])
    lines = []
    for workload, target in TARGET_SPEEDUP.items():
        x = ratio.get((workload, "engine"))
        if x is not None:
            lines.append(f"{workload}: engine {x:.2f}x llama.cpp (target {target}x) "
                         f"{'MET' if x >= target else 'NOT MET'}")
    return lines


def print_report(result: dict, console: Console | None = None) -> None:
    console = console or Console()
    if not console.is_terminal:
        console.width = max(console.width, 160)  # a log file: keep each row on one line
    console.print(table(result))
    console.print(compute_table(result))
    for system in result["systems"]:
        if system["skipped"]:
            console.print(f"[yellow]skipped {system['system']}[/yellow]: {system['skipped']}")
    for name, stats in result["workloads"].items():
        console.print(f"{name}: {stats['requests']} requests, prompts {stats['prompt_len_min']}-"
                      f"{stats['prompt_len_max']} tokens ({stats['shared_prefix_tokens']} shared by all), "
                      f"{stats['max_tokens']} output tokens each")
    for line in target_lines(result):
        console.print(line)


def write_outputs(result: dict, out_dir: str | Path) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "bench.json", out / "bench.png"  # and bench.md, the tables as Markdown
    json_path.write_text(json.dumps(result, indent=2, default=_nan_safe))
    (out / "bench.md").write_text(markdown(result))
    plot(result, png_path)
    return json_path, png_path


def _nan_safe(value):
    return None if isinstance(value, float) and math.isnan(value) else str(value)


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratio = speedups(result["runs"])
    runs = [r | {"speedup": ratio.get((r["workload"], r["system"]), 0.0)} for r in result["runs"]]
    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    systems = list(dict.fromkeys(r["system"] for r in runs))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    first = ("speedup", "total tokens/s relative to llama.cpp") if ratio else ("total_tok_s", "total tokens/s")
    panels = [first, ("ttft_p50_s", "TTFT p50 s (lower is better)"),
              ("tpot_p50_s", "TPOT p50 s (lower is better)")]
    width = 0.8 / max(len(systems), 1)
    for ax, (key, title) in zip(axes, panels):
        for i, system in enumerate(systems):
            values = [next((r[key] for r in runs if r["workload"] == w and r["system"] == system), 0.0)
                      for w in workloads]
            ax.bar([j + i * width for j in range(len(workloads))], values, width, label=system)
        ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(workloads))], workloads)
        ax.set_title(title)
    if ratio:  # dashed: the engine's target over llama.cpp
        for j, w in enumerate(workloads):
            if w in TARGET_SPEEDUP:
                axes[0].hlines(TARGET_SPEEDUP[w], j - width / 2, j + 0.8 - width / 2, colors="k", linestyles="--")
    axes[0].legend()
    fig.suptitle(f"batchinfer bench: {result['machine']['cpu']}, {result['machine']['cores']} cores, "
                 f"{result['machine']['date_utc']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(result: dict) -> str:
    """The same figures as Markdown tables, for docs/benchmarks.md."""
    ratio = speedups(result["runs"])
    lines = ["| workload | system | ok/req | wall s | total tok/s | out tok/s | vs llama.cpp | TTFT p50/p99 s "
             "| TPOT p50/p99 ms | prefix hit | peak RSS MiB |", "|" + "---|" * 11]
    for r in _sorted(result["runs"]):
        x = ratio.get((r["workload"], r["system"]))
        lines.append(f"| {r['workload']} | {r['system']} | {r['requests'] - r['failures']}/{r['requests']} "
                     f"| {r['wall_s']:.2f} | {r['total_tok_s']:.1f} | {r['output_tok_s']:.1f} "
                     f"| {'-' if x is None else f'{x:.2f}x'} | {r['ttft_p50_s']:.2f}/{r['ttft_p99_s']:.2f} "
                     f"| {_ms(r['tpot_p50_s'])}/{_ms(r['tpot_p99_s'])} | {r['prefix_hit_rate']:.0%} "
                     f"| {r['peak_rss_mib']:.0f} |")
    lines += ["", "| workload | system | prefill s | prefill GFLOP | prefill GFLOP/s (% peak) | decode s "
              "| decode GFLOP | decode GFLOP/s (% peak) |", "|" + "---|" * 8]
    for r in _sorted(result["runs"]):
        if "prefill_s" in r:
            lines.append(f"| {r['workload']} | {r['system']} | {r['prefill_s']:.2f} | {r['prefill_gflop']:.1f} "
                         f"| {r['prefill_gflops']:.1f} ({r['prefill_pct_peak']:.1f}%) | {r['decode_s']:.2f} "
                         f"| {r['decode_gflop']:.1f} | {r['decode_gflops']:.1f} ({r['decode_pct_peak']:.1f}%) |")
    lines += [""] + [f"- {line}" for line in target_lines(result)]
    return "\n".join(lines) + "\n"
