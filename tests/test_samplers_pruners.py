"""Every sampler and pruner group of ``hydra/sweeper=ds_optuna``, built and run through the sweeper.

Each group (``hydra/sweeper/sampler=<name>``, ``hydra/sweeper/pruner=<name>``, registered in
``hydra_plugins/ds_optuna_sweeper/config.py``) runs a short sweep of ``tests/apps/sweep_app.py``. The
class the sweeper really built is read from its own log line (``Study '...' ... sampler X, pruner Y``):
a study loaded back with ``optuna.load_study`` gets a default sampler, so it cannot tell. What the
sampler or pruner left in the study shows that it worked with the arguments given: the exact points of
QMC, grid and brute force, a seeded replay of TPE and random, the generation attributes of NSGA-II/III,
GP's relative-sampling attribute from its startup count on, and for every pruner the step at which each
trial stopped, derived from the app's intermediate values (trial n reports ``10 n + x**2 - 0.1 step``:
later trials are worse, and each trial improves step by step).

Every case runs in process at world size 1 (``tests/in_process.py``): which sampler or pruner is built and
what it proposes or prunes is rank 0's alone. That every rank runs rank 0's params and stops at rank 0's
step is the same-params and prune-at-the-same-step contracts' (``tests/multirank/test_sweep.py``, C01 and
C05), which replaced the 2-rank QMC and patient-pruner launches here.
"""

import json
import re
from dataclasses import dataclass, field
from typing import Callable

import optuna
import pytest
from optuna.trial import TrialState

from tests.in_process import sweep
from tests.multirank.sweep_helpers import load, records

C, P = TrialState.COMPLETE, TrialState.PRUNED
STUDY_LINE = re.compile(r"Study '([^']+)' in .*?, sampler (\w+), pruner (\w+); budget")
#: Overrides shared by the pruner cases: seeded random sampling, 4 reported steps, no sleep.
PRUNE_BASE = ("x=interval(-1,1)", "hydra/sweeper/sampler=random", "hydra.sweeper.sampler.seed=0", "steps=4",
              "sleep_s=0")


def built_classes(output: str) -> tuple[str, str]:
    """``(sampler class, pruner class)`` from the sweeper's one study line (rank 0 alone writes it)."""
    found = STUDY_LINE.findall(output)
    assert len(found) == 1, f"expected one study line, got {found}\n{output[-4000:]}"
    return found[0][1], found[0][2]


def assert_finished(study: optuna.Study, n: int, states=(C,)) -> None:
    """``n`` trials, each in one of ``states`` (never RUNNING or FAIL)."""
    assert len(study.trials) == n, [t.state for t in study.trials]
    assert all(t.state in states for t in study.trials), [(t.number, t.state) for t in study.trials]


def last_step(t: optuna.trial.FrozenTrial) -> int:
    return max(t.intermediate_values)


def replay(sampler: optuna.samplers.BaseSampler, n: int) -> list[float]:
    """The first ``n`` values of x that ``sampler`` proposes on an in-memory study, told as the app tells."""
    study = optuna.create_study(sampler=sampler)
    xs = []
    for _ in range(n):
        trial = study.ask({"x": optuna.distributions.FloatDistribution(-1, 1)})
        xs.append(trial.params["x"])
        study.tell(trial, trial.params["x"] ** 2 + 1)
    return xs


# --- samplers -------------------------------------------------------------------------------------


@dataclass
class SamplerCase:
    overrides: tuple[str, ...]
    n_trials: int
    cls: str
    check: Callable[[optuna.Study, str], None]
    needs: str | None = None  # optional package the sampler imports at run time
    expected_trials: int | None = None  # when the sampler stops before n_trials


def _check_tpe(study, output):
    # The seed reached Optuna's TPESampler: its startup trials are the seeded replay's.
    assert [t.params["x"] for t in study.trials] == replay(optuna.samplers.TPESampler(seed=0), 3)


def _check_random(study, output):
    assert [t.params["x"] for t in study.trials] == replay(optuna.samplers.RandomSampler(seed=3), 3)


def _check_cmaes(study, output):
    # CMA-ES samples trials after its startup trial relatively and tags them with its generation.
    assert "cma:generation" not in study.trials[0].system_attrs
    assert all("cma:generation" in t.system_attrs for t in study.trials[1:])


def _check_nsga(prefix):
    def check(study, output):
        # population_size=2: trials 0-1 are generation 0, trial 2 starts generation 1.
        assert [t.system_attrs[f"{prefix}:generation"] for t in study.trials] == [0, 0, 1]
        assert all(len(t.values) == 2 for t in study.trials)
    return check


def _check_qmc(study, output):
    # Trial 0 is sampled independently (the search space is unknown yet); then the unscrambled
    # Sobol sequence on [-1, 1].
    assert [t.params["x"] for t in study.trials[1:]] == [-1.0, 0.0, 0.5]


def _check_gp(study, output):
    # n_startup_trials=2 reached GPSampler: trials 0-1 random, then Gaussian-process proposals.
    assert ["gp:relative_params:0" in t.system_attrs for t in study.trials] == [False, False, True, True]


def _check_grid(study, output):
    points = sorted((t.params["y"], t.params["label"]) for t in study.trials)
    assert points == [(y, lab) for y in (1, 2, 3) for lab in ("a", "b")]  # each point once
    assert all(t.system_attrs["search_space"] == {"label": ["a", "b"], "y": [1, 2, 3]} for t in study.trials)
    assert "Sweep finished: the sampler has no point left" in output


def _check_bruteforce(study, output):
    points = sorted((t.params["y"], t.params["label"]) for t in study.trials)
    assert points == [(y, lab) for y in (1, 2) for lab in ("a", "b")]
    assert "Sweep finished: the sampler has no point left" in output


TWO_OBJECTIVES = ("x=interval(-1,1)", "y=range(1,3)", "n_objectives=2", "hydra.sweeper.direction=[minimize,minimize]",
                  "hydra.sweeper.sampler.population_size=2", "hydra.sweeper.sampler.seed=0")
SAMPLERS = {
    "tpe": SamplerCase(("x=interval(-1,1)", "hydra.sweeper.sampler.seed=0"), 3, "TPESampler", _check_tpe),
    "random": SamplerCase(("x=interval(-1,1)", "hydra.sweeper.sampler.seed=3"), 3, "RandomSampler", _check_random),
    "cmaes": SamplerCase(("x=interval(-1,1)", "y=interval(0,2)", "hydra.sweeper.sampler.seed=0"), 3, "CmaEsSampler",
                         _check_cmaes, needs="cmaes"),
    "nsgaii": SamplerCase(TWO_OBJECTIVES, 3, "NSGAIISampler", _check_nsga("NSGAIISampler")),
    "nsgaiii": SamplerCase(TWO_OBJECTIVES, 3, "NSGAIIISampler", _check_nsga("NSGAIIISampler")),
    "qmc": SamplerCase(("x=interval(-1,1)",), 4, "QMCSampler", _check_qmc),
    "gp": SamplerCase(("x=interval(-1,1)", "hydra.sweeper.sampler.n_startup_trials=2", "hydra.sweeper.sampler.seed=0"),
                      4, "GPSampler", _check_gp),
    "grid": SamplerCase(("y=range(1,4)", "label=choice(a,b)"), 10, "GridSampler", _check_grid, expected_trials=6),
    "bruteforce": SamplerCase(("y=range(1,3)", "label=choice(a,b)"), 10, "BruteForceSampler", _check_bruteforce,
                              expected_trials=4),
}


def test_every_registered_sampler_and_pruner_has_a_case():
    """The cases below cover every name in the sampler and pruner groups (a new group needs a case)."""
    from hydra.core.config_store import ConfigStore

    import hydra_plugins.ds_optuna_sweeper.config  # noqa: F401  (registers the groups)

    repo = ConfigStore.instance().repo["hydra"]["sweeper"]
    assert {n.removesuffix(".yaml") for n in repo["sampler"]} == set(SAMPLERS)
    assert {n.removesuffix(".yaml") for n in repo["pruner"]} == set(PRUNERS)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", list(SAMPLERS))
def test_sampler_group_builds_that_sampler_and_its_trials_finish(tmp_path, name):
    """``hydra/sweeper/sampler=<name>`` at world size 1: the sweeper built that Optuna sampler, with
    the arguments given (seed, population size, startup trials), and every trial finished COMPLETE."""
    case = SAMPLERS[name]
    if case.needs:
        pytest.importorskip(case.needs, reason=f"the {name} sampler needs `pip install {case.needs}` "
                                               "(no extra of this project installs it)")
    res = sweep(tmp_path, f"hydra/sweeper/sampler={name}", f"hydra.sweeper.n_trials={case.n_trials}",
                *case.overrides).check()
    assert built_classes(res.output) == (case.cls, "NopPruner")
    study = load(tmp_path)
    assert_finished(study, case.expected_trials or case.n_trials)
    case.check(study, res.output)


def test_a_sampler_that_fails_in_ask_stops_the_sweep_clearly(tmp_path):
    """A sampler raising inside ``Study.ask`` (``CmaEsSampler`` without ``cmaes`` does) stops the
    sweep with a non-zero exit and a message naming the error; the trial before it is COMPLETE."""
    res = sweep(tmp_path, "hydra/sweeper/sampler=random", "hydra.sweeper.sampler._target_=search_space_fns.FailingSampler",
                "hydra.sweeper.n_trials=3", "x=interval(-1,1)")
    assert res.returncode != 0
    assert "rank 0 could not prepare the next trial: ModuleNotFoundError: No module named 'not_installed_here'" in res.output
    study = load(tmp_path)
    assert study.trials[0].state == C
    # The trial Study.ask created before the sampler raised is closed, not left RUNNING forever.
    assert [t.state for t in study.trials] == [C, TrialState.FAIL], [(t.number, t.state.name) for t in study.trials]
    assert "Trial 1 marked FAIL (the sampler raised while it was asked)" in res.output


def test_ctrl_c_inside_an_ask_leaves_no_trial_running(caplog):
    """Ctrl-C while rank 0 asks (the trial created, one of its two params stored, no owner record yet): the trial
    is closed FAIL before the exception goes on, instead of staying RUNNING for good and counting in ``n_trials``
    (a real in-memory study; the sweep's own Ctrl-C path is ``tests/faults/test_skipped_calls_and_ctrl_c.py``)."""
    from optuna.distributions import FloatDistribution, IntDistribution

    import importlib.util

    from hydra_plugins.ds_optuna_sweeper._study import _tell
    from hydra_plugins.ds_optuna_sweeper._study._queue import counted_trials
    from hydra_plugins.ds_optuna_sweeper._study._stored import NEVER_RAN_ATTR
    from tests.in_process import APPS

    spec = importlib.util.spec_from_file_location("search_space_fns", APPS / "search_space_fns.py")
    fns = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fns)
    InterruptedSampler = fns.InterruptedSampler

    study = optuna.create_study(sampler=InterruptedSampler(seed=0))
    space = {"x": FloatDistribution(-1, 1), "y": IntDistribution(1, 3)}
    first = _tell.ask(study, space, launch_group=None, trial_group=None, fixed=())
    study.tell(first, 1.0)
    with pytest.raises(KeyboardInterrupt):
        _tell.ask(study, space, launch_group=None, trial_group=None, fixed=())
    assert [t.state for t in study.trials] == [C, TrialState.FAIL], [(t.number, t.state.name) for t in study.trials]
    assert "Trial 1 marked FAIL (its ask was interrupted (KeyboardInterrupt))" in caplog.text
    # it never ran: the budget counts trial 0 alone (a SIGTERM in the ask under --max-restarts ran one short)
    assert study.trials[1].user_attrs.get(NEVER_RAN_ATTR) is True
    assert counted_trials(study) == 1


# --- pruners --------------------------------------------------------------------------------------


@dataclass
class PrunerCase:
    overrides: tuple[str, ...]
    n_trials: int
    cls: str
    #: ``[(state, last reported step)]`` per trial, or a callable checking the study.
    expected: list[tuple[TrialState, int]] | Callable[[optuna.Study], None]
    base: tuple[str, ...] = field(default=PRUNE_BASE)


def _check_hyperband(study):
    # Brackets are assigned by a hash of study name and trial number; in each bracket the first
    # trial cannot be pruned (nothing to compare with) and later, worse trials stop at a rung.
    assert study.trials[0].state == C and last_step(study.trials[0]) == 3
    pruned = [t for t in study.trials if t.state == P]
    assert pruned, "hyperband pruned nothing"
    assert all(last_step(t) < 3 and "completed_rung_0" in t.system_attrs for t in pruned)


PRUNERS = {
    "nop": PrunerCase((), 3, "NopPruner", [(C, 3)] * 3),
    # n_startup_trials=2: trials 2 and 3 are worse than the median at step 0.
    "median": PrunerCase(("hydra.sweeper.pruner.n_startup_trials=2",), 4, "MedianPruner", [(C, 3), (C, 3), (P, 0), (P, 0)]),
    "percentile": PrunerCase(("hydra.sweeper.pruner.n_startup_trials=2",), 4, "PercentilePruner",
                             [(C, 3), (C, 3), (P, 0), (P, 0)]),
    # Rung 0 is at step 1; reduction_factor=2 keeps the best half, and later trials are worse.
    "successive_halving": PrunerCase(("hydra.sweeper.pruner.min_resource=1", "hydra.sweeper.pruner.reduction_factor=2"),
                                     4, "SuccessiveHalvingPruner", [(C, 3), (P, 1), (P, 1), (P, 1)]),
    "hyperband": PrunerCase(("hydra.sweeper.pruner.max_resource=4",), 6, "HyperbandPruner", _check_hyperband),
    # upper=5: trial 0 stays below, trials 1+ (values >= 10) stop at their first step.
    "threshold": PrunerCase(("hydra.sweeper.pruner.upper=5.0",), 3, "ThresholdPruner", [(C, 3), (P, 0), (P, 0)]),
    # Maximize, so each trial gets worse step by step. The wrapped threshold pruner (lower=5) wants
    # trial 0 (values < 1) pruned from step 0, but patience=1 holds it until step 2, when its best of
    # the last 2 steps is worse than before; trials 1+ (values >= 10) the threshold never prunes.
    "patient": PrunerCase(("hydra.sweeper.pruner.wrapped_pruner={_target_:optuna.pruners.ThresholdPruner,lower:5.0}",
                           "hydra.sweeper.direction=maximize"), 3, "PatientPruner", [(P, 2), (C, 3), (C, 3)]),
    # Steps are instances: trials 1+ are worse than the best trial at every step, and the one-sided
    # signed-rank test drops below p_threshold=0.1 at 4 pairs (p = 1/16), i.e. at step 3.
    "wilcoxon": PrunerCase((), 3, "WilcoxonPruner", [(C, 5), (P, 3), (P, 3)],
                           base=tuple(o if o != "steps=4" else "steps=6" for o in PRUNE_BASE)),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", list(PRUNERS))
def test_pruner_group_builds_that_pruner_and_prunes_at_the_expected_step(tmp_path, name):
    """``hydra/sweeper/pruner=<name>`` at world size 1: the sweeper built that Optuna pruner, with
    the arguments given, and each trial ended COMPLETE or PRUNED at the step the pruner's rule gives
    for the app's intermediate values."""
    case = PRUNERS[name]
    res = sweep(tmp_path, f"hydra/sweeper/pruner={name}", f"hydra.sweeper.n_trials={case.n_trials}", *case.base,
                *case.overrides).check()
    assert built_classes(res.output) == ("RandomSampler", case.cls)
    study = load(tmp_path)
    assert_finished(study, case.n_trials, states=(C, P))
    if callable(case.expected):
        case.expected(study)
    else:
        assert [(t.state, last_step(t)) for t in study.trials] == case.expected
    recs = records(tmp_path)
    for t in study.trials:  # the task obeyed: a pruned trial's job stopped at the stored step
        pruned_file = tmp_path / "records" / f"pruned_trial{t.number}_rank0.json"
        assert pruned_file.exists() == (t.state == P)
        if t.state == P:
            assert json.loads(pruned_file.read_text())["step"] == last_step(t)
        assert recs[(t.number, 0)]["config"]["x"] == t.params["x"]


@pytest.mark.timeout(60)
def test_direction_maximize_makes_the_best_trial_the_largest_value(tmp_path):
    """README: ``direction`` ``minimize``, ``maximize``. Three enqueued trials whose largest and smallest
    values differ (x=0.1, 0.9, -0.5: x**2 + 1 is 1.01, 1.81, 1.25): with ``maximize`` the study, the
    results file, each trial's line and the summary table all name trial 1 (the largest) as best."""
    res = sweep(tmp_path, "hydra.sweeper.direction=maximize", "hydra.sweeper.n_trials=3", "x=interval(-1,1)",
                "hydra.sweeper.enqueue_trials=[{x:0.1},{x:0.9},{x:-0.5}]").check()
    study = load(tmp_path)
    values = {t.number: t.value for t in study.trials}
    assert values == {0: 0.1 ** 2 + 1.0, 1: 0.9 ** 2 + 1.0, 2: (-0.5) ** 2 + 1.0}
    assert min(values, key=values.get) == 0 and max(values, key=values.get) == 1  # min and max differ
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    assert study.best_trial.number == 1 and study.best_value == values[1]
    from omegaconf import OmegaConf

    results = OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml")
    assert (results.best_trial, results.best_value, dict(results.best_params)) == (1, values[1], {"x": 0.9})
    assert results.best_overrides[-1] == "x=0.9" and results.rerun_command.endswith("x=0.9")
    # Trial 2 (1.25) is better than trial 0 but not than trial 1: the best so far stays trial 1.
    assert re.search(r"\[2/3\] Trial 1 COMPLETE value 1\.81 .*; best 1\.81 \(trial 1\)", res.output), res.output[-3000:]
    assert re.search(r"\[3/3\] Trial 2 COMPLETE value 1\.25 .*; best 1\.81 \(trial 1\)", res.output), res.output[-3000:]
    starred = [line.split()[1] for line in res.output.splitlines() if re.match(r"^\*\s+\d+\s+COMPLETE", line)]
    assert starred == ["1"], res.output[-3000:]
