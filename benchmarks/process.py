"""Whole-process bench: each system as its own timed process on the same requests, start-up included.

`batchinfer run FILE` against a llama.cpp process (benchmarks.llamacpp_process) on the same GGUF,
in its three ways. Per process: wall time and peak RSS (the child's own VmHWM).
The suite is the whole-process table of docs/benchmarks.md; the goal is batchinfer at least 2.5x faster than the best llama.cpp way.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .workloads import Workload, build

# name -> (workload builder, requests, max_tokens)
SUITE = {
    "1 request, 1 out": ("single", 1, 1),
    "32 over one shared document, 8 out": ("shared-prefix", 32, 8),
    "96 over three interleaved documents, 8 out": ("three-documents", 96, 8),
    "32 unshared, up to 48 out": ("no-sharing", 32, 48),
    "16 requests, 128 out": ("long-decode", 16, 128),
}
# the 1B-class files of issue 46 (benchmarks/gguf_model.py): the two workloads its table names
SUITE_1B = {
    "16 over one shared document, 8 out": ("shared-prefix", 16, 8),
    "16 unshared, 32 out": ("no-sharing", 16, 32),
}
SUITES = {"smollm2": SUITE, "1b": SUITE_1B}
SYSTEMS = ("batchinfer", "llamacpp-file", "llamacpp-sorted", "llamacpp-batched")
GOAL = 2.5


def request_file(workload: Workload, path: Path) -> None:
    """The workload as an OpenAI Batch file: greedy, the same messages the token prompts came from."""
    with open(path, "w") as out:
        for i, (system, user) in enumerate(workload.chats):
            body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                    "max_tokens": workload.max_tokens, "temperature": 0}
            out.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                                  "body": body}) + "\n")


def timed(cmd: list[str], env: dict, timeout_s: float) -> dict:
    """Run one process; wall time, CPU time (user + sys, from wait4: it moves less than wall time on a shared
    machine; a child it waited for, such as `run`'s engine process, counts) and its own peak RSS: the largest
    VmHWM seen while it ran, plus its children's (the engine process's; pages they share from before the fork
    count twice). Not wait4's ru_maxrss: on Linux a forked child starts with its parent's high-water mark, so
    a big parent inflates it."""
    start = time.time()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
        try:
            status, peak_kib, usage = _wait4(proc, timeout_s)
        except TimeoutError:
            proc.kill()
            proc.wait()
            return {"wall_s": None, "cpu_s": None, "max_rss_mib": None, "rc": None,
                    "error": f"timed out after {timeout_s:.0f} s"}
        wall = time.time() - start
        out.seek(0)
        err.seek(0)
        rc = os.waitstatus_to_exitcode(status)
        result = {"wall_s": round(wall, 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
                  "max_rss_mib": round(peak_kib / 1024, 1), "rc": rc,
                  "stdout": out.read().decode(errors="replace")[-2000:]}
        if rc != 0:
            result["error"] = err.read().decode(errors="replace")[-600:]
        return result


def _wait4(proc: subprocess.Popen, timeout_s: float) -> tuple[int, int, resource.struct_rusage]:
    """(wait status, peak VmHWM in KiB, resource usage) once the process exits, VmHWM sampled while it runs."""
    deadline, peak = time.time() + timeout_s, 0
    while time.time() < deadline:
        peak = max(peak, tree_hwm_kib(proc.pid))
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return status, peak, usage
        time.sleep(0.01)
    raise TimeoutError


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return []


def tree_hwm_kib(pid: int) -> int:
    """VmHWM of a process plus its children's (an engine process's)."""
    return hwm_kib(pid) + sum(map(hwm_kib, children(pid)))


def hwm_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, ValueError):
        pass
    return 0


def _command(system: str, work: Path, gguf: str, threads: int) -> list[str]:
    if system == "batchinfer":
        return [sys.executable, "-m", "batchinfer.cli", "run", str(work / "requests.jsonl"),
                "-o", str(work / "results.jsonl")]
    mode = system.removeprefix("llamacpp-")
    return [sys.executable, "-m", "benchmarks.llamacpp_process", str(work / "tokens.json"),
            "--gguf", gguf, "--mode", mode, "--threads", str(threads)]


def _output_tokens(system: str, work: Path, result: dict) -> int | None:
    try:
        if system == "batchinfer":
            lines = (work / "results.jsonl").read_text().splitlines()
            return sum(json.loads(line)["response"]["body"]["usage"]["completion_tokens"] for line in lines)
        return json.loads(result["stdout"])["output_tokens"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_process_bench(tokenizer, gguf: str, out_dir: Path, suite: dict, systems: tuple[str, ...],
                      env: dict, threads: int = 2, timeout_s: float = 900, progress=print, repeat: int = 1) -> dict:
    """Every system on every workload, `repeat` rounds with the systems alternating (a load that comes and goes
    on a shared machine falls on all of them); each row one process."""
    rows = []
    for label, (name, requests, max_tokens) in suite.items():
        workload = build(name, tokenizer, requests, max_tokens)
        work = out_dir / name
        work.mkdir(parents=True, exist_ok=True)
        request_file(workload, work / "requests.jsonl")
        (work / "tokens.json").write_text(json.dumps({"prompts": workload.prompts, "max_tokens": max_tokens}))
        for round_ in range(repeat):
            for system in systems if round_ % 2 == 0 else systems[::-1]:
                progress(f"{label}: {system}" + (f" (round {round_ + 1})" if repeat > 1 else ""))
                result = timed(_command(system, work, gguf, threads), env, timeout_s)
                result["output_tokens"] = _output_tokens(system, work, result)
                result.pop("stdout", None)
                rows.append({"work": label, "workload": name, "requests": requests, "max_tokens": max_tokens,
                             "prompt_tokens": workload.prompt_tokens, "system": system, "round": round_, **result})
    return {"rows": rows, "goal": GOAL}


def markdown(report: dict) -> str:
    lines = [("| work (whole process, greedy) | batchinfer run | llama.cpp file order | sorted | multi-sequence "
              "| best llama.cpp / batchinfer | per round: median (range) |"), "|---|---|---|---|---|---|---|"]
    by_work: dict[str, dict[str, dict]] = {}
    for row in report["rows"]:  # each system's fastest round
        best = by_work.setdefault(row["work"], {}).get(row["system"])
        if best is None or (_ok(row) and (not _ok(best) or row["wall_s"] < best["wall_s"])):
            by_work[row["work"]][row["system"]] = row
    for work, cells in by_work.items():
        walls = [cells[s]["wall_s"] for s in SYSTEMS if s in cells and s != "batchinfer" and _ok(cells[s])]
        ours = cells["batchinfer"]["wall_s"] if _ok(cells.get("batchinfer")) else None
        ratio = f"{min(walls) / ours:.2f}x" if walls and ours else "-"
        lines.append(f"| {work} | " + " | ".join(_cell(cells.get(s)) for s in SYSTEMS) + f" | {ratio} | "
                     f"{_round_ratios(report['rows'], work)} |")
    return "\n".join(lines) + "\n"


def _round_ratios(rows: list[dict], work: str) -> str:
    """Each round's best llama.cpp over ours in the same round (the minutes a VM's speed drifts over fall on
    both): a best-of-rounds ratio can pair one system's lucky minute with the other's slow one."""
    by_round: dict[int, dict[str, float]] = {}
    for row in rows:
        if row["work"] == work and _ok(row):
            by_round.setdefault(row.get("round", 0), {})[row["system"]] = row["wall_s"]
    ratios = sorted(min(w for s, w in walls.items() if s != "batchinfer") / walls["batchinfer"]
                    for walls in by_round.values() if "batchinfer" in walls and len(walls) > 1)
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})"


def _ok(row: dict | None) -> bool:
    return row is not None and row.get("rc") == 0 and bool(row.get("wall_s"))


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    if row.get("error") or row["wall_s"] is None:
        return f"failed ({(row.get('error') or '').strip().splitlines()[-1][:60] if row.get('error') else 'rc'})"
    cpu = f" ({row['cpu_s']:.1f} s CPU)" if row.get("cpu_s") is not None else ""
    return f"{row['wall_s']:.2f} s{cpu}, {row['max_rss_mib']:.0f} MiB"
