"""Real two-node worlds (issue 42): ``torchrun --nnodes 2 --nproc-per-node 2`` on each of two hosts (network
namespaces joined by one link, ``tests/multinode/netns.py``), c10d rendezvous on host a, the plain DDP example
(``examples/ddp_mlp.py``, CPU, gloo) sweeping 3 trials. Every global rank of both hosts runs each trial with the
same params and config; the study on a file both hosts see holds exactly the budget."""

import optuna
import pytest
from optuna.trial import TrialState

from tests.multinode.checks import WORLD, assert_every_rank_agrees, assert_two_nodes, ddp_records
from tests.multinode.launch import run_two_nodes, tails

pytestmark = [pytest.mark.multinode, pytest.mark.torchrun, pytest.mark.timeout(240)]

SCRIPT = "examples/ddp_mlp.py"
N_TRIALS = 3


def _sweep_args(sweep, *extra: str) -> list[str]:
    return ["-m", f"hydra.sweep.dir={sweep}", f"hydra.sweeper.n_trials={N_TRIALS}", "epochs=1",
            "hydra.sweeper.plots=false", "hydra.sweeper.rank_timeout=30", *extra]


def _check_sweep(nodes, tmp_path, study: optuna.Study) -> None:
    assert [n.proc.returncode for n in nodes] == [0, 0], tails(nodes)
    assert_two_nodes(nodes)
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * N_TRIALS, [(t.number, t.state.name) for t in trials]
    recs = ddp_records(tmp_path / "records")
    assert sorted(recs) == [(n, r) for n in range(N_TRIALS) for r in range(WORLD)], sorted(recs)
    assert_every_rank_agrees(recs, range(N_TRIALS))
    for t in trials:  # the params the study holds are the ones every rank ran
        assert recs[(t.number, 0)]["params"] == t.params, (t.params, recs[(t.number, 0)]["params"])
    sweep = tmp_path / "sweep"
    for n in range(N_TRIALS):  # one job dir per trial, a job log per global rank, whichever host it ran on
        logs = sorted(p.name for p in (sweep / str(n)).glob("*.log"))
        assert logs == [f"ddp_mlp_rank{r}.log" for r in range(WORLD)], logs
        for r in range(WORLD):
            assert f"rank {r}/{WORLD} runs trial {n} with params" in (sweep / str(n) / f"ddp_mlp_rank{r}.log").read_text()


def test_two_node_sweep_on_sqlite_in_the_shared_sweep_dir(two_hosts, tmp_path):
    """The default storage, ``sqlite:///<sweep dir>/optuna.db``, in a directory both hosts see: the sweep's ranks 0-3
    spread two per host, every rank runs trials 0-2 with the same params, the study holds 3 COMPLETE trials."""
    sweep = tmp_path / "sweep"
    nodes = run_two_nodes(two_hosts, SCRIPT, _sweep_args(sweep), tmp_path, rdzv_id="sqlite1",
                          env={"DSO_RECORD_DIR": str(tmp_path / "records")})
    study = optuna.load_study(study_name="ddp_mlp", storage=f"sqlite:///{sweep}/optuna.db")
    _check_sweep(nodes, tmp_path, study)


@pytest.mark.soak
def test_two_node_sweep_on_a_journal_file(two_hosts, tmp_path):
    """The same sweep with the study on Optuna's journal file storage (``JournalFileBackend``) outside the sweep dir,
    a file both hosts see."""
    journal = tmp_path / "study" / "journal.log"
    journal.parent.mkdir()
    storage = ("{_target_:optuna.storages.JournalStorage,log_storage:"
               f"{{_target_:optuna.storages.journal.JournalFileBackend,file_path:'{journal}'}}}}")
    nodes = run_two_nodes(two_hosts, SCRIPT, _sweep_args(tmp_path / "sweep", f"hydra.sweeper.storage={storage}"),
                          tmp_path, rdzv_id="journal1", env={"DSO_RECORD_DIR": str(tmp_path / "records")})
    backend = optuna.storages.journal.JournalFileBackend(str(journal))
    study = optuna.load_study(study_name="ddp_mlp", storage=optuna.storages.JournalStorage(backend))
    _check_sweep(nodes, tmp_path, study)


@pytest.mark.soak
def test_two_node_sweep_on_postgresql_reached_over_the_link(two_hosts, tmp_path):
    """The same sweep with the study on a throwaway PostgreSQL server started in host b's namespace
    (``tests/multinode/pg_server.py``): global rank 0, which alone talks to the study, runs on host a (the c10d
    rendezvous orders nodes by their ``--local-addr``, and a's is the lower), so every storage call crosses the
    link."""
    from tests.multinode.pg_server import PgServer, why_no_pg

    reason = why_no_pg()
    if reason:
        pytest.skip(reason)
    server = PgServer(two_hosts.b)
    try:
        server.start()
        nodes = run_two_nodes(two_hosts, SCRIPT, _sweep_args(tmp_path / "sweep", f"hydra.sweeper.storage={server.url}"),
                              tmp_path, rdzv_id="pg1", env={"DSO_RECORD_DIR": str(tmp_path / "records")})
        assert "rank 0/4 " in nodes[0].output() and "rank 0/4 " not in nodes[1].output(), tails(nodes)
        # Read the study from host a, over the link (the root namespace cannot reach the server).
        _check_sweep(nodes, tmp_path, _load_over_link(two_hosts, server.url, tmp_path))
    finally:
        server.stop()


def _load_over_link(two_hosts, url: str, tmp_path) -> optuna.Study:
    """The study as read from inside host a's namespace (a short Python run there), copied into an in-memory
    study for the assertions."""
    import subprocess
    import sys

    copy = tmp_path / "copy.db"
    code = ("import optuna,sys; s=optuna.load_study(study_name='ddp_mlp',storage=sys.argv[1]); "
            "optuna.copy_study(from_study_name='ddp_mlp',from_storage=sys.argv[1],to_storage=sys.argv[2])")
    res = subprocess.run([*two_hosts.a.exec_prefix(), sys.executable, "-c", code, url, f"sqlite:///{copy}"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-3000:]
    return optuna.load_study(study_name="ddp_mlp", storage=f"sqlite:///{copy}")


@pytest.mark.soak
def test_eight_ranks_over_two_hosts(two_hosts, tmp_path):
    """``--nproc-per-node 4`` on each host: a world of 8 ranks, 4 per host (ranks 0-3 on one, 4-7 on the other),
    every rank runs trials 0 and 1 with the same params and config; the study holds 2 COMPLETE trials."""
    sweep = tmp_path / "sweep"
    args = ["-m", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=2", "epochs=1", "hydra.sweeper.plots=false",
            "hydra.sweeper.rank_timeout=60"]
    nodes = run_two_nodes(two_hosts, SCRIPT, args, tmp_path, rdzv_id="eight1", nproc=4, timeout_s=300,
                          env={"DSO_RECORD_DIR": str(tmp_path / "records"), "OMP_NUM_THREADS": "1"})
    assert [n.proc.returncode for n in nodes] == [0, 0], tails(nodes)
    assert_two_nodes(nodes, per_node=4)
    study = optuna.load_study(study_name="ddp_mlp", storage=f"sqlite:///{sweep}/optuna.db")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    recs = ddp_records(tmp_path / "records")
    assert sorted(recs) == [(n, r) for n in range(2) for r in range(8)], sorted(recs)
    assert_every_rank_agrees(recs, range(2), world=8)
    for n in range(2):
        assert sorted(p.name for p in (sweep / str(n)).glob("*.log")) == sorted(f"ddp_mlp_rank{r}.log" for r in range(8))
