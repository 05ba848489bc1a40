"""The parts of the GPU support that a CPU-only machine can check (docs/reference/gpus.md, "GPUs" section).

- ``uses_nccl``: which backend strings send CUDA tensors through NCCL.
- ``probe_tensor``: the device of the tensor probing the default group after a failed trial, from the
  backend string (``cpu:gloo,cuda:nccl`` a CPU tensor, ``nccl`` alone a CUDA one).
- ``_bind_device``: without CUDA (or without NCCL) no device is selected and no ``device_id`` is passed.
- ``summary_table``: "rank 0's peak allocated GPU memory as the trial's ``gpu_peak_allocated_bytes`` user
  attribute (also in the trial's log line and the final table)", from a real Optuna study holding it.

What needs a GPU (the device binding itself, the recorded peak) is checked by ``bench/gpu_check.sh``.
"""

import optuna
import pytest
import torch

from hydra_plugins.ds_optuna_sweeper._loop._group import _bind_device, default_backend, probe_tensor, uses_nccl
from hydra_plugins.ds_optuna_sweeper._study._results import summary_table
from hydra_plugins.ds_optuna_sweeper._study._stored import GPU_PEAK_ATTR

#: For what a CPU-only machine does (a GPU machine is checked by bench/gpu_check.sh).
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")

MiB = 2**20


@pytest.mark.parametrize(("backend", "expected"), [
    ("nccl", True), ("NCCL", True), ("cuda:nccl", True), ("cpu:gloo,cuda:nccl", True),
    ("gloo", False), ("cpu:gloo", False), ("mpi", False), ("", False), (None, False),
])
def test_uses_nccl_reads_the_backend_string(backend, expected):
    assert uses_nccl(backend) is expected


@pytest.mark.parametrize("backend", ["gloo", "cpu:gloo", "cpu:gloo,cuda:nccl", "CPU:GLOO,CUDA:NCCL"])
def test_probe_tensor_is_a_cpu_tensor_when_the_backend_has_a_cpu_half_or_no_nccl(backend):
    probe = probe_tensor(backend)
    assert probe.device.type == "cpu" and probe.shape == (1,) and float(probe) == 0.0


@pytest.mark.parametrize("backend", ["nccl", "NCCL", "cuda:nccl"])
@cpu_only
def test_probe_tensor_asks_for_a_cuda_tensor_when_nccl_is_the_only_backend(backend):
    # No CUDA here: asking torch for the current CUDA device fails, which shows the CUDA path was taken.
    with pytest.raises((AssertionError, RuntimeError), match="CUDA"):
        probe_tensor(backend)


@cpu_only
@pytest.mark.parametrize("backend", ["cpu:gloo,cuda:nccl", "nccl", "gloo"])
@pytest.mark.parametrize("local_rank", [0, 3])
def test_bind_device_selects_nothing_without_cuda(backend, local_rank):
    assert _bind_device(backend, local_rank) == {}
    assert not torch.cuda.is_initialized()


@cpu_only
def test_default_backend_without_cuda_is_gloo():
    assert default_backend() == "gloo"


def _study_with(peaks: dict[int, int | None]) -> optuna.Study:
    """A real in-memory study: trial n has value n, param x = n / 10 and, when ``peaks[n]`` is not
    None, ``gpu_peak_allocated_bytes`` = ``peaks[n]`` bytes."""
    study = optuna.create_study(direction="minimize")
    dist = optuna.distributions.FloatDistribution(0.0, 1.0)
    for n, peak in peaks.items():
        study.add_trial(optuna.trial.create_trial(
            value=float(n), params={"x": n / 10}, distributions={"x": dist},
            user_attrs={} if peak is None else {GPU_PEAK_ATTR: peak}))
    return study


def _rows(table: str) -> list[list[str]]:
    return [line.split() for line in table.splitlines()]


def test_summary_table_has_a_gpu_mib_column_from_the_user_attribute():
    table = summary_table(_study_with({0: 1536 * MiB, 1: None, 2: int(300.4 * MiB)}))
    header, *rows = _rows(table)
    assert header == ["trial", "state", "value", "seconds", "GPU", "MiB", "params"], table
    # best (trial 0) starred; MiB rounded to whole numbers; "-" for a trial that recorded none.
    assert rows[0][:3] == ["*", "0", "COMPLETE"] and rows[0][5] == "1536" and rows[0][6] == "x=0.0", table
    assert rows[1][:2] == ["1", "COMPLETE"] and rows[1][4] == "-" and rows[1][5] == "x=0.1", table
    assert rows[2][:2] == ["2", "COMPLETE"] and rows[2][4] == "300" and rows[2][5] == "x=0.2", table


def test_summary_table_has_no_gpu_column_when_no_trial_recorded_a_peak():
    table = summary_table(_study_with({0: None, 1: None}))
    header, *rows = _rows(table)
    assert header == ["trial", "state", "value", "seconds", "params"], table
    assert "GPU" not in table and rows[1] == ["1", "COMPLETE", "1", rows[1][3], "x=0.1"]
