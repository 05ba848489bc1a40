"""Helpers shared by the benchmarks: machine description, tables, result files."""

import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
#: Overrides for "no pruning": a median pruner that never leaves its start-up phase prunes nothing. Written
#: so when conf/train.yaml still set median-pruner keys inline (``hydra/sweeper/pruner=nop`` did not compose;
#: case C38, now an option file); kept so that the committed results and new runs use the same arm.
NO_PRUNING = ["hydra/sweeper/pruner=median", "hydra.sweeper.pruner.n_startup_trials=1000000"]


def machine() -> dict:
    """Cores, CPU model, memory, Python and library versions of this machine."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for mod in ("torch", "optuna", "hydra", "transformers", "deepspeed"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:
            versions[mod] = None
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        **versions,
    }


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation."""
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def markdown_table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def save(name: str, table_md: str, data: dict, command: str, out: Path = RESULTS) -> None:
    """Write ``<out>/<name>.md`` and ``.json`` with the machine and the command.

    Args:
        name: file stem, e.g. ``"overhead"``.
        table_md: the Markdown table (and any lines under it) the benchmark printed.
        data: the raw figures, stored in the JSON beside ``command`` and ``machine``.
        command: the command that made the figures, repo-relative (``python bench/<name>.py ...``).
        out: the folder; ``bench/results`` (CPU figures the README and docs/performance.md cite) unless a caller names another, as
            ``bench/gpu_check.py`` does with ``bench/results/gpu`` so a GPU run never overwrites a CPU result.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    m = machine()
    md = (
        f"{table_md}\n\nCommand: `{command}`\n\nMachine: {m['cores']} cores, {m['cpu']}, Python {m['python']}, "
        f"torch {m['torch']}, optuna {m['optuna']}, hydra {m['hydra']}\n"
    )
    (out / f"{name}.md").write_text(md)
    (out / f"{name}.json").write_text(json.dumps({"command": command, "machine": m, **data}, indent=1))
    print(md)


def env(**extra: str) -> dict:
    e = dict(os.environ)
    e.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
             # CPU benchmarks hide GPUs; bench/gpu_check.py names the GPUs to use in BENCH_CUDA_VISIBLE_DEVICES.
             CUDA_VISIBLE_DEVICES=e.get("BENCH_CUDA_VISIBLE_DEVICES", ""), PYTHONUNBUFFERED="1")
    e.update(extra)
    return e


def torchrun(nproc: int, script: str, args: list[str], *, timeout_s: float, extra_env: dict | None = None,
             log_path: Path | None = None) -> int:
    """Run ``torchrun --standalone --nproc-per-node nproc script args``; return its exit code."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           str(REPO / script), *args]
    with open(log_path or os.devnull, "w") as log:
        proc = subprocess.run(cmd, cwd=REPO, env=env(**(extra_env or {})), stdout=log, stderr=subprocess.STDOUT,
                              timeout=timeout_s)
    return proc.returncode
