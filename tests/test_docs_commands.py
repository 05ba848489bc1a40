"""Every shell command in the README and in every page of the documentation site runs as written, or is listed
with the reason it is not run here (issue 43, item 3).

A command is a line of a fenced code block that is unmarked or marked ``bash``/``sh``/``shell``/``console``,
whose first word (after ``VAR=value`` assignments and a ``$`` prompt) is a program (:data:`PROGRAMS`), joined
across ``\\`` line continuations, the ``# comment`` after it dropped. Each one is either

- in :data:`RUN`: run by :func:`test_docs_command_runs_as_written` (marker ``soak``; ``torchrun`` where it starts
  ranks) from a copy of the repository's files in a temporary folder, with this interpreter's environment as the
  page's ``.venv`` (``.venv/bin`` first on ``PATH``), CPU/gloo, a timeout, and the checks of what the page says
  it prints or writes; or
- in :data:`EXCLUDED`, with a one-line reason (a SLURM cluster, two nodes, PyPI, a command that never ends...).

:func:`test_every_docs_command_is_run_or_excluded` (not soak: it is only text) fails on a new command that is in
neither table, and on an entry whose command left the docs, so the tables cannot rot.

What a run changes, always said in its entry and nothing else: ``append`` adds overrides (or ``make`` variables)
at the end of the command to shrink the work (fewer trials, fewer epochs, a slice of the data); ``sub`` replaces a
placeholder the page uses for the reader's own things (``train.py`` and ``app.py``, whose pages show sketches,
``...``, a path on a shared filesystem) with the repository's own (the tutorial's finished ``examples/ddp_mlp.py``).

Run them with ``pytest -m soak -p no:cacheprovider tests/test_docs_commands.py`` (about 10 min on 2 cores;
``make soak`` runs them with the other soak tests).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs_text import documents
from tests.test_readme_commands import cheap_commands
from tests.torchrun_utils import REPO, base_env, run_command

#: Code block languages whose lines are shell (unmarked blocks too).
SHELL_LANGS = ("", "bash", "sh", "shell", "console")
#: First words that make a line of a shell block a command (anything else there is output the page shows).
PROGRAMS = {
    "python", "python3", "torchrun", "make", "pip", "pip3", "uv", "srun", "sbatch", "salloc", "squeue", "scancel",
    "export", "cd", "bash", "sh", "tail", "cat", "ls", "mkdir", "rm", "cp", "git", "curl", "wget", "docker",
    "pytest", "mkdocs", "optuna", "optuna-dashboard", "mlflow", "tensorboard", "wandb", "accelerate", "deepspeed",
    "conda", "source", ".",
}


def _is_command(line: str) -> bool:
    """Whether a line of a shell block is a command: its first word, after ``VAR=value`` assignments, is in
    :data:`PROGRAMS` or a path to ``python``/``torchrun`` (``.venv/bin/python``)."""
    words = line.split()
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]
    if not words:
        return False
    first = words[0].rstrip(";&|")
    return first in PROGRAMS or bool(re.match(r"^\S*/(python3?|torchrun)$", first))


def doc_commands(text: str) -> list[str]:
    """The commands of ``text``'s shell code blocks (see the module docstring), in order, each once, with runs of
    spaces made one."""
    found: list[str] = []
    for lang, body in re.findall(r"^```([a-z]*)[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
        if lang not in SHELL_LANGS:
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = re.sub(r"^\$ ", "", line.strip())
            line = re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip()
            line = " ".join(line.split())
            if _is_command(line) and line not in found:
                found.append(line)
    return found


def all_doc_commands() -> dict[str, list[str]]:
    """``{command: [documents that hold it]}`` over the README and every docs page."""
    found: dict[str, list[str]] = {}
    for name, text in documents().items():
        for command in doc_commands(text):
            found.setdefault(command, []).append(name)
    return found


@dataclass(frozen=True)
class Run:
    """How one docs command is run, and what its run must show.

    Attributes:
        append: text added at the end of the command to shrink the work (overrides, ``make`` variables).
        sub: ``(placeholder, replacement)`` pairs for what the page leaves to the reader.
        expect: regular expressions the output must match (searched), besides the generic sweep checks.
        trials: for a sweep, the number of trials its study must count at the end (``Sweep finished: the study
            holds N trials``, or ``... holds T trials, N of them counted``), and the ``optimization_results.yaml``
            it names exists); ``None``: not a sweep.
        timeout_s: seconds the command may take here (2 CPU cores).
        twice: run the command a second time (a resume) and check ``expect_again`` in that output.
        expect_again: regular expressions the second run's output must match.
    """

    append: str = ""
    sub: tuple[tuple[str, str], ...] = ()
    expect: tuple[str, ...] = ()
    trials: int | None = None
    timeout_s: int = 300
    twice: bool = False
    expect_again: tuple[str, ...] = ()

    def command(self, written: str, folder: Path) -> str:
        """The command line that runs: ``written`` with :attr:`sub` applied (``{tmp}`` is the run's folder) and
        :attr:`append` added; every substitution must hit."""
        line = written
        for old, new in self.sub:
            assert old in line, f"placeholder {old!r} is not in {written!r}: update the RUN entry"
            line = line.replace(old, new.replace("{tmp}", str(folder)))
        return f"{line} {self.append}".strip()


#: The reader's own ``train.py`` (README, tutorial, checkpoints, stop rules): the tutorial's finished example.
TRAIN_PY = ("train.py", "examples/ddp_mlp.py")
#: Shrink the DDP/Lightning examples: two trials of two epochs.
SMALL_MLP = "hydra.sweeper.n_trials=2 epochs=2"
#: Shrink the HF example: one trial on a slice of the questions (the LoRA page's own slice).
SMALL_HF = "hydra.sweeper.n_trials=1 data.train_size=64 data.eval_size=32"
#: The same for a run that refits: the held-out rows scored once, a slice of them too.
SMALL_HF_REFIT = SMALL_HF + " data.test_size=32"
#: The header of the demo's table, as the README shows it (the demo pads the columns).
DEMO_TABLE = (r"\| config +\| trial +\| lr +\| warmup +\| weight decay +\| eval acc \(search\) +\| "
              r"test acc \(refit\) +\|")
SWEPT = r"the study holds"  # "Sweep finished: ...", or with trial groups "Trial group k/K finished its search: ..."

#: Commands run as written (with the entry's appended shrink and named placeholders).
RUN: dict[str, Run] = {
    # README, tutorial (Step 3), the reader's app: the finished example of the tutorial.
    "torchrun --standalone --nproc_per_node 2 train.py -m": Run(sub=(TRAIN_PY,), append=SMALL_MLP, trials=2),
    "torchrun --standalone --nproc_per_node 2 train.py -m 'epochs=choice(6,12)'": Run(
        sub=(TRAIN_PY,), append="hydra.sweeper.n_trials=2", trials=2, expect=(r"'epochs': (6|12)",)),
    "python train.py -m": Run(sub=(TRAIN_PY,), append=SMALL_MLP, trials=2, expect=(r"over 1 rank\(s\)",)),
    ".venv/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 examples/ddp_mlp.py -m": Run(
        append=SMALL_MLP, trials=2, expect=(r"over 2 rank\(s\)",)),
    ".venv/bin/python examples/ddp_mlp.py -m": Run(append=SMALL_MLP, trials=2, expect=(r"over 1 rank\(s\)",)),
    # Resume (checkpoints.md): 8 ranks of the DDP example; the same command again resumes the same study.
    "torchrun --nproc_per_node 8 train.py -m hydra.sweep.dir=multirun/my-sweep hydra.sweeper.n_trials=40": Run(
        sub=(TRAIN_PY,), append=SMALL_MLP, trials=2, timeout_s=300, twice=True,
        expect=(r"over 8 rank\(s\)", r"multirun/my-sweep/optimization_results\.yaml"),
        expect_again=(r"the study holds 2 trials",)),
    "torchrun --nproc_per_node 2 examples/ddp_mlp.py -m hydra/sweeper/sampler=random hydra/sweeper/pruner=nop "
    "hydra.sweeper.sampler.seed=0": Run(append=SMALL_MLP, trials=2),
    "torchrun --nproc_per_node 2 examples/ddp_mlp.py -m hydra.sweeper.n_jobs=2": Run(
        append="hydra.sweeper.n_trials=4 epochs=2", trials=4, expect=(r"trial group",)),
    # Stop rules: as written, on the DDP example (up to 60 trials of 12 epochs; the goal ends it sooner).
    "torchrun --nproc_per_node 2 train.py -m hydra.sweeper.direction=maximize hydra.sweeper.n_trials=60 "
    "hydra.sweeper.stop.goal=0.9 hydra.sweeper.stop.patience=15": Run(
        sub=(TRAIN_PY,), timeout_s=540,
        expect=(r"Sweep finished: hydra\.sweeper\.stop\.goal reached: best value 0\.9\d* >= 0\.9 \(trial \d+\)",)),
    "torchrun --standalone --nproc_per_node 2 examples/ddp_mlp.py -m hydra/sweeper/pruner=nop "
    "hydra/sweeper/scheduler=pbt hydra.sweeper.scheduler.interval=2 hydra.sweeper.scheduler.max_steps=6 "
    "'hydra.sweeper.scheduler.mutations=[lr]' hydra.sweeper.n_trials=4 epochs=6": Run(trials=4, timeout_s=300),
    # Shared studies: the journal file, with the launch the page leaves out and a folder of this run for /shared.
    "torchrun ... -m '+hydra.sweeper.storage={_target_:optuna.storages.JournalStorage,log_storage:{_target_:optuna."
    "storages.journal.JournalFileBackend,file_path:/shared/sweeps/minilm.log}}'": Run(
        sub=(("torchrun ...", "torchrun --standalone --nproc_per_node 2 examples/ddp_mlp.py"),
             ("/shared/sweeps/", "{tmp}/shared/sweeps/")), append=SMALL_MLP, trials=2),
    # Lightning: the example.
    ".venv/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 examples/lightning_mlp.py -m": Run(
        append=SMALL_MLP, trials=2),
    # Tracking: the reader's app.py and "..." (its other arguments) are the DDP example and nothing; the experiment
    # is the study's name (the page's app.py: 'app'; the example's: 'ddp_mlp').
    "torchrun --nproc-per-node 2 app.py -m 'hydra.sweeper.tracking.report_to=[mlflow]' ...": Run(
        sub=(("app.py", "examples/ddp_mlp.py"), (" ...", "")), append=SMALL_MLP, trials=2,
        expect=(r"Tracking: MLflow: mlflow ui --backend-store-uri sqlite:////\S+/mlflow\.db  "
                r"\(experiment 'ddp_mlp'\)",)),
    # HF Trainer + DeepSpeed (examples/train.py), one trial on a slice of the data.
    "torchrun --standalone --nproc_per_node 2 examples/train.py -m": Run(append=SMALL_HF, trials=1),
    "torchrun --standalone --nproc_per_node 2 examples/train.py -m deepspeed=zero3": Run(
        append=SMALL_HF, trials=1, expect=(r"deepspeed=zero3|stage.{0,3}3",)),
    "torchrun --standalone --nproc_per_node 2 examples/train.py -m 'training.gradient_accumulation_steps=choice(1,2)'":
        Run(append=SMALL_HF, trials=1, expect=(r"'training.gradient_accumulation_steps': [12]",)),
    "torchrun --nproc_per_node 2 examples/train.py -m hydra.sweeper.refit.enabled=true "
    "\"hydra.sweeper.refit.overrides=['data.stage=final']\" \"hydra.sweeper.refit.trials=[best]\" "
    "\"hydra.sweeper.refit.baselines={lr_1e-4:{training.learning_rate:1e-4}}\"": Run(
        append=SMALL_HF_REFIT, trials=1, timeout_s=420,
        expect=(r"lr_1e-4", r"hand_picked_default", r"trainingarguments_defaults")),
    "torchrun --nproc_per_node 2 examples/train.py -m "
    "\"hydra.sweeper.enqueue_trials=[{training.learning_rate:3e-4,training.warmup_steps:0.1}]\"": Run(
        append=SMALL_HF, trials=1, expect=(r"Trial 0 COMPLETE .*'training.learning_rate': 0.0003\b",)),
    "torchrun --standalone --nproc_per_node 2 examples/train.py -m hydra/sweeper/pruner=nop "
    "hydra/sweeper/scheduler=asha hydra.sweeper.scheduler.min_steps=250 hydra.sweeper.scheduler.max_steps=1000 "
    "hydra.sweeper.scheduler.reduction_factor=2 hydra.sweeper.n_trials=4": Run(
        append="data.train_size=64 data.eval_size=32", trials=4, timeout_s=540, expect=(r"PAUSED",)),
    "torchrun --standalone --nproc_per_node 2 examples/lora_finetune.py -m": Run(
        append=SMALL_HF, trials=1, expect=(r"LoRA r=\d+ alpha=\d+: [\d,]+ of [\d,]+ parameters trained",)),
    # The demo (HF + DeepSpeed, then the refit and the table): one trial on a slice, the make variables kept.
    "make demo": Run(append=f"ARGS='{SMALL_HF_REFIT}'", trials=1, timeout_s=420,
                     expect=(DEMO_TABLE, r"\| best found +\|", r"\| hand-picked default +\|")),
    "make demo ARGS='hydra.sweep.dir=multirun/demo-2026-11-30_06-00-00'": Run(
        sub=(("06-00-00'", f"06-00-00 {SMALL_HF_REFIT}'"),), trials=1, timeout_s=420,
        expect=(r"Sweep dir: \S+/multirun/demo-2026-11-30_06-00-00\n", DEMO_TABLE)),
    "make demo ARGS='hydra.sweeper.n_jobs=2'": Run(
        sub=(("n_jobs=2'", f"n_jobs=2 {SMALL_HF_REFIT} hydra.sweeper.n_trials=2'"),), trials=2, timeout_s=420,
        expect=(DEMO_TABLE, r"Trial \d \(group 1\) COMPLETE")),
    # The documentation site, with the docs environment as the page's own (see _environment).
    "make docs": Run(timeout_s=300, expect=(r"Documentation built",)),
}

_COVERED_CHEAP = "prints and exits: run as written by tests/test_readme_commands.py (make test)"
_PYPI = "installs from PyPI (network, minutes); make install does the same pinned install, CI runs it"
_SLURM = "needs a SLURM cluster: tests/slurm/test_slurm.py (soak, marker slurm) runs this recipe on a local one"

#: Commands not run here, each with why.
EXCLUDED: dict[str, str] = {
    "python examples/ddp_mlp.py --cfg hydra": _COVERED_CHEAP,
    "python examples/ddp_mlp.py --cfg job": _COVERED_CHEAP,
    "python examples/ddp_mlp.py --info searchpath": _COVERED_CHEAP,
    "python examples/train.py --cfg job": _COVERED_CHEAP,
    "python examples/lora_finetune.py --cfg job": _COVERED_CHEAP,
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu": _PYPI,
    'pip install "./hydra-ds-optuna-sweeper"': _PYPI + " (the clone's own folder name)",
    'pip install "./hydra-ds-optuna-sweeper[hf]"': _PYPI + " (the clone's own folder name)",
    "pip install '.[postgres]'": _PYPI,
    "pip install optuna-dashboard && optuna-dashboard sqlite:///multirun/<sweep>/optuna.db":
        "installs from PyPI, then serves a web UI until stopped",
    "make install": "creates .venv from PyPI (the first step of make demo and make test, which run here)",
    "make test": "the test suite itself (this test is in it), 13 min",
    "torchrun --nproc_per_node 8 examples/train.py -m hydra/sweeper=ds_optuna "
    "training.learning_rate='tag(log,interval(1e-5,1e-3))' training.gradient_accumulation_steps='choice(1,2,4)'":
        "8 ranks of the HF + DeepSpeed example (an 8-GPU node); the 2-rank HF sweeps above run the same code",
    "torchrun --nproc_per_node 8 examples/train.py -m hydra.sweeper.n_jobs=4":
        "8 ranks of the HF + DeepSpeed example (an 8-GPU node); trial groups of 2 HF ranks: "
        "tests/multirank/test_trial_groups_training.py (soak)",
    "torchrun --nproc_per_node 8 examples/train.py -m hydra.sweeper.storage=postgresql://user@dbhost:5432/optuna "
    "hydra.sweeper.study_name=minilm-trec6 hydra.sweeper.n_trials=64":
        "a PostgreSQL server the reader has (dbhost), 8 ranks; tests/multirank/test_shared_study.py runs "
        "launches on one PostgreSQL study",
    "torchrun --nnodes 2 --nproc-per-node 8 --node-rank 0 --rdzv-backend c10d --rdzv-endpoint node0:29400 "
    "--rdzv-id sweep1 examples/train.py -m":
        "two nodes: tests/multinode/test_two_nodes.py runs a two-node world (marker multinode)",
    "GLOO_SOCKET_IFNAME=veth-a torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "
    "198.18.0.1:29400 --rdzv-id sweep1 --local-addr 198.18.0.1 --rdzv-conf is_host=1,join_timeout=120 "
    "examples/ddp_mlp.py -m hydra.sweep.dir=/shared/sweeps/ddp1 hydra.sweeper.n_trials=3":
        "host a of two network namespaces (root, ip): tests/multinode/test_two_nodes.py runs exactly this",
    "export DSO_STORAGE='postgresql://optuna:secret@db.example.org:5432/optuna'": "a variable for the sbatch line; "
                                                                                   + _SLURM,
    "export STUDY_NAME=minilm-trec6": "a variable for the sbatch line; " + _SLURM,
    "sbatch --array=0-3 examples/slurm/sweep.sbatch examples/train.py hydra.sweeper.n_trials=64": _SLURM,
    "NPROC_PER_NODE=2 sbatch --array=0-1 --nodes=1 --gpus-per-node=0 --cpus-per-task=2 --mem=4G --time=0:30:00 "
    "--partition=debug examples/slurm/sweep.sbatch examples/ddp_mlp.py hydra.sweeper.n_trials=8": _SLURM,
    "make slurm-cluster": "root and apt-get (slurm-wlm, munge); " + _SLURM,
    "export SLURM_CONF=/tmp/dso-slurm/slurm.conf": _SLURM,
    "export DSO_STORAGE=postgresql://postgres@127.0.0.1:5432/test NPROC_PER_NODE=2": _SLURM,
    "sbatch --array=0-1 --nodes=1 --gpus-per-node=0 --cpus-per-task=1 --mem=2G --time=0:10:00 "
    "examples/slurm/sweep.sbatch tests/apps/sweep_app.py hydra.sweeper.n_trials=4 'x=interval(-1,1)' sleep_s=2":
        _SLURM,
    "squeue; tail -f ds-optuna-*_0.out": "follows a SLURM job's log until stopped; " + _SLURM,
    "make slurm-stop": _SLURM,
}


# --- the tables follow the docs -------------------------------------------------------------------------------


def test_every_docs_command_is_run_or_excluded():
    """A command new in the docs must get an entry (run or excluded, with a reason), and an entry whose command
    left the docs must go; no command is in both tables."""
    commands = all_doc_commands()
    new = {c: where for c, where in commands.items() if c not in RUN and c not in EXCLUDED}
    assert not new, ("docs commands neither run nor excluded in tests/test_docs_commands.py (add each to RUN, or "
                     f"to EXCLUDED with a reason): {new}")
    stale = [c for c in [*RUN, *EXCLUDED] if c not in commands]
    assert not stale, f"entries of tests/test_docs_commands.py whose command is in no docs page any more: {stale}"
    assert not set(RUN) & set(EXCLUDED)
    assert all(reason.strip() for reason in EXCLUDED.values())


def test_the_cheap_commands_excluded_here_are_the_ones_the_readme_test_runs():
    """The exclusions that point at tests/test_readme_commands.py hold only while that test collects them."""
    cheap = set(cheap_commands())
    for command, reason in EXCLUDED.items():
        if reason == _COVERED_CHEAP:
            assert command in cheap, command


def test_the_collector_finds_commands_and_leaves_output_and_other_languages_out():
    """The oracle of the collector: a block's commands (continued lines joined, comments, prompts and variable
    assignments handled) are found; the output a page shows and a Python block are not."""
    text = (
        "Intro `python inline.py` (inline code is not collected)\n"
        "```\n"
        "$ torchrun --nproc_per_node 2 app.py -m \\\n    x=1   # a comment\n"
        "[1/3] Trial 0 COMPLETE value 0.5\n"
        "Sweep finished: the study holds 3 trials\n"
        "FOO=1 sbatch job.sbatch\n"
        "squeue; tail -f x.out\n"
        "# on node 0\n"
        "```\n"
        "```python\npython = 3\nimport torch\n```\n"
        "```console\n.venv/bin/python -m torch.distributed.run x.py\naccelerate launch x.py\n```\n"
    )
    assert doc_commands(text) == ["torchrun --nproc_per_node 2 app.py -m x=1", "FOO=1 sbatch job.sbatch",
                                  "squeue; tail -f x.out", ".venv/bin/python -m torch.distributed.run x.py",
                                  "accelerate launch x.py"]


# --- running them ---------------------------------------------------------------------------------------------


def _environment(folder: Path) -> None:
    """Make ``folder`` what the pages assume: a clone of the repository (its tracked and new files, as in this
    working tree) whose ``.venv`` and ``.venv-docs`` (the Makefile's) are this interpreter's environment: each a
    folder with the environment's ``pyvenv.cfg``, ``bin`` and ``lib`` linked and a fresh ``.installed``, so that
    ``make`` finds them made and installs nothing, and ``.venv/bin/python`` is this environment's Python."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = REPO / name
        if source.is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, folder / name)
    prefix = Path(sys.prefix)
    for venv in (".venv", ".venv-docs"):
        target = folder / venv
        target.mkdir()
        shutil.copy(prefix / "pyvenv.cfg", target / "pyvenv.cfg")
        for part in ("bin", "lib", "lib64"):
            if (prefix / part).exists():
                (target / part).symlink_to(prefix / part)
    time.sleep(0.01)  # the markers newer than every copied Makefile and pyproject.toml
    for venv in (".venv", ".venv-docs"):
        (folder / venv / ".installed").touch()


def _results_files(output: str) -> list[Path]:
    return [Path(p) for p in re.findall(r"results in (\S+optimization_results\.yaml)", output)]


def _check(output: str, expect: tuple[str, ...], trials: int | None) -> None:
    for pattern in expect:
        assert re.search(pattern, output), f"{pattern!r} is not in the output:\n{output[-6000:]}"
    if trials is not None:
        # "holds 4 trials (n_trials=4)", or where a scheduler's continuations, retries or never-ran trials are
        # not counted "holds 12 trials, 4 of them counted (n_trials=4)" (_study/_policy.Budget)
        assert re.search(rf"{SWEPT} (?:{trials} trials?\b|\d+ trials, {trials} of them counted)", output), \
            output[-6000:]
        files = _results_files(output)
        assert files and all(f.is_file() for f in files), (files, output[-4000:])


def _run_params():
    for command, entry in RUN.items():
        marks = [pytest.mark.timeout(entry.timeout_s * (2 if entry.twice else 1) + 60)]
        if re.search(r"torchrun|torch\.distributed\.run|make demo", command):
            marks.append(pytest.mark.torchrun)
        yield pytest.param(command, entry, marks=marks, id=command[:90])


@pytest.mark.soak
@pytest.mark.parametrize(("written", "entry"), list(_run_params()))
def test_docs_command_runs_as_written(tmp_path, written, entry):
    """Run the page's command (plus the entry's shrink and placeholders, nothing else) with bash in a copy of the
    repository; it must exit 0, and print and write what the page says (the entry's checks)."""
    assert written in all_doc_commands(), f"{written!r} is in no docs page"
    folder = tmp_path / "clone"
    folder.mkdir()
    _environment(folder)
    cwd = folder
    (tmp_path / "shared" / "sweeps").mkdir(parents=True)
    command = entry.command(written, tmp_path)
    venv_bin = folder / ".venv" / "bin"
    env = base_env(PATH=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONPATH=str(folder),
                   NO_MKDOCS_2_WARNING="1")
    env.pop("VIRTUAL_ENV", None)
    print("$", command)
    res = run_command(["bash", "-c", command], timeout_s=entry.timeout_s, cwd=cwd, env=env)
    print(res.output)  # shown by pytest when the test fails
    res.check()
    _check(res.output, entry.expect, entry.trials)
    if entry.twice:
        again = run_command(["bash", "-c", command], timeout_s=entry.timeout_s, cwd=cwd, env=env).check()
        _check(again.output, entry.expect_again, entry.trials)


@pytest.mark.soak
@pytest.mark.timeout(180)
def test_the_output_the_readme_and_the_tutorial_show_is_what_their_command_prints(tmp_path):
    """The README and the tutorial show the output of ``python examples/ddp_mlp.py -m hydra.sweeper.n_trials=3
    epochs=2`` (one process, seeded): run it and find each line shown (``...`` stands for anything; a trial's
    seconds and the ETA vary)."""
    folder = tmp_path / "clone"
    folder.mkdir()
    _environment(folder)
    command = "python examples/ddp_mlp.py -m hydra.sweeper.n_trials=3 epochs=2"
    env = base_env(PATH=f"{folder / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                   PYTHONPATH=str(folder))
    res = run_command(["bash", "-c", command], timeout_s=120, cwd=folder, env=env).check()
    for name in ("README.md", "docs/tutorial/ddp-sweep.md"):
        text = documents()[name]
        assert f"`{command}`" in text, (name, command)
        block = re.search(r"```\n(\[1/3\] Trial 0 .*?)```", text, flags=re.S)
        assert block, name
        for line in block.group(1).splitlines():
            if line.strip() in ("", "..."):
                continue
            pattern = re.escape(line.strip()).replace(r"\.\.\.", ".*")
            pattern = re.sub(r"in\\ [\d\\.]+\\ s", r"in\\ [\\d.]+\\ s", pattern)
            pattern = re.sub(r"ETA\\ \d+\\ s", r"ETA\\ \\d+\\ s", pattern)
            assert re.search(pattern, res.output), (name, line, res.output[-4000:])
    assert shlex.split(command)[0] == "python"
