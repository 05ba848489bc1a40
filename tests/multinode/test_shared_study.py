"""Two two-node launches sharing one study (issue 42, item 4): both run on hosts a and b at once (rendezvous ports
29400 and 29401), one rank per node and ``hydra.sweeper.n_jobs=2`` in each, so each launch runs two 1-rank trial
groups, one per host, asked for by its global rank 0 on host a. The study is an SQLite file both hosts see
(locked first contact, ``flock``), each launch keeps its own sweep dir. A soak test."""

import optuna
import pytest
from optuna.trial import TrialState

from tests.multinode.checks import ddp_records
from tests.multinode.launch import start_node, tails, wait_nodes

pytestmark = [pytest.mark.multinode, pytest.mark.torchrun, pytest.mark.soak, pytest.mark.timeout(300)]

N_TRIALS = 6


def test_two_two_node_launches_with_two_trial_groups_each_share_one_study(two_hosts, tmp_path):
    """Both launches end 0; the study holds ``N_TRIALS`` trials, or one more (the README's overshoot rule: one trial
    per extra launch counting the study at the same moment; the number is printed), all COMPLETE or PRUNED;
    each trial ran once, on one 1-rank group, with the params the study holds; both launches ran trials."""
    study_db = tmp_path / "study" / "optuna.db"
    study_db.parent.mkdir()
    nodes = []
    for i, port in enumerate((29400, 29401)):
        args = ["-m", f"hydra.sweep.dir={tmp_path / f'sweep{i}'}", f"hydra.sweeper.storage=sqlite:///{study_db}",
                f"hydra.sweeper.n_trials={N_TRIALS}", "hydra.sweeper.n_jobs=2", "epochs=1",
                "hydra.sweeper.plots=false", "hydra.sweeper.rank_timeout=30"]
        env = {"DSO_RECORD_DIR": str(tmp_path / "records")}
        nodes += [start_node(h, two_hosts, "examples/ddp_mlp.py", args, rdzv_id=f"shared{i}", nproc=1, port=port,
                             log=tmp_path / f"launch{i}-{h.name}.log", env=env) for h in (two_hosts.a, two_hosts.b)]
    wait_nodes(nodes, timeout_s=240)
    assert [n.proc.returncode for n in nodes] == [0] * 4, tails(nodes)
    trials = optuna.load_study(study_name="ddp_mlp", storage=f"sqlite:///{study_db}").get_trials(deepcopy=False)
    print(f"\n{len(trials)} trials for n_trials={N_TRIALS} with two launches of two trial groups each")
    assert N_TRIALS <= len(trials) <= N_TRIALS + 1, [(t.number, t.state.name) for t in trials]
    # The example's median pruner may stop a trial once 5 others completed (both launches' trials count).
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials), [(t.number, t.state.name)
                                                                                      for t in trials]
    recs = ddp_records(tmp_path / "records")
    assert sorted(recs) == [(t.number, 0) for t in trials], sorted(recs)  # one 1-rank group per trial
    for t in trials:
        assert recs[(t.number, 0)]["params"] == t.params and recs[(t.number, 0)]["world_size"] == 1
    # Trial group 0 on host a, group 1 on host b, in each launch; host b's groups ran trials too.
    for node in nodes:
        own, other = ("0/2", "1/2") if node.host is two_hosts.a else ("1/2", "0/2")
        out = node.output()
        assert f"rank 0/1 of trial group {own} (local" in out and f"trial group {other}" not in out, tails([node])
    assert any("of trial group 1/2 runs trial" in n.output() for n in nodes if n.host is two_hosts.b), tails(nodes)
    per_launch = [sum(1 for d in (tmp_path / f"sweep{i}").iterdir() if d.name.isdigit()) for i in (0, 1)]
    assert all(per_launch) and sum(per_launch) == len(trials), per_launch
