"""``python app.py -m`` (torchrun forgotten) says once that it searches at world size 1 (issue 38, C59).

A new user's sweep ran at world size 1 without a word, each trial 7-10x slower than under torchrun, because
torchrun sets ``OMP_NUM_THREADS=1`` for its ranks and a plain process lets torch use every core (measured in
``_loop/_sweep.world_size_one_notice``'s docstring). The notice names the torchrun command and, with ``OMP_NUM_THREADS``
unset, how many threads torch uses; under torchrun it never appears
(``tests/multirank/test_sweep.py::test_c01_one_study_one_sampler_same_config_on_every_rank``).

In process (``tests/in_process.py``, issue 39 item 1): the run is ``python tests/apps/sweep_app.py -m ...``
without torchrun's variables, the notice is rank 0's.
"""

import os

import pytest

from tests.in_process import APPS, sweep

NOTICE = "ds_optuna: this sweep runs at world size 1 (not started by torchrun): every trial runs in this one process."
APP = APPS / "sweep_app.py"


@pytest.mark.parametrize("omp", [None, "1"])
def test_a_sweep_without_torchrun_says_so_once_with_the_torchrun_command(tmp_path, monkeypatch, omp):
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # as a user's shell has it
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    res = sweep(tmp_path, "x=interval(-1,1)", "hydra.sweeper.n_trials=2").check()
    assert res.output.count(NOTICE) == 1, res.output[-4000:]
    line = next(ln for ln in res.output.splitlines() if NOTICE in ln)
    assert f"To run each trial on N ranks: torchrun --nproc_per_node N {APP} -m " in line, line
    assert "'x=interval(-1,1)'" in line  # quoted for a shell
    assert res.output.index(line) < res.output.index("Launching 1 jobs")  # before trial 0
    if omp:  # the user chose the thread count: nothing to say about it
        assert "OMP_NUM_THREADS" not in line
    elif (os.cpu_count() or 1) > 1:
        assert "OMP_NUM_THREADS is not set, so torch uses " in line and "torchrun sets OMP_NUM_THREADS=1" in line, line
