"""Every command of the cheap kind (``--cfg``, ``--info``, ``--help``: Hydra prints and exits, no training) in
the README and in every page of the documentation site (``docs/``, issue 43) runs as written (case C46:
``python app.py -m --cfg hydra`` was refused by Hydra 1.3, "Only one of --run, --multirun, --cfg, --info and
--shell_completion can be specified").

``app.py`` is the Lightning how-to's own task (``docs/how-to/lightning.md``) and ``conf/config.yaml`` the YAML
next to it, both taken from the page's text; a script path of the repository runs as it is.
"""

import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.docs_text import documents, page
from tests.torchrun_utils import REPO, base_env, run_command

#: The README and every page of the docs site, by name.
DOCUMENTS = documents()
#: The page that holds ``app.py`` and its config.
LIGHTNING = page("how-to/lightning.md")

#: Hydra flags that print and exit without running the task.
CHEAP_FLAGS = ("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help")


def readme_commands(text: str | None = None) -> list[str]:
    """Every ``python <script>.py ...`` command of ``text`` (default: the README and every docs page), from code
    blocks and inline code, joined across ``\\`` line continuations; comments after ``#`` dropped."""
    if text is None:
        found: list[str] = []
        for one in DOCUMENTS.values():
            found += [c for c in readme_commands(one) if c not in found]
        return found
    texts = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    blocks = [line for text in texts for line in text.replace("\\\n", " ").splitlines()]
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    commands = []
    for line in [*blocks, *inline]:
        line = line.split(" #", 1)[0].strip()
        if re.match(r"^(\S*/)?python3? (\S+\.py)\b", line):
            commands.append(line)
    return commands


def cheap_commands() -> list[str]:
    return [c for c in readme_commands() if any(flag in shlex.split(c) for flag in CHEAP_FLAGS)]


def _block_after(marker: str, lang: str) -> str:
    """The first ``lang`` code block after ``marker`` in the Lightning how-to."""
    start = LIGHTNING.index(marker)
    match = re.compile(rf"```{lang}\n(.*?)```", re.S).search(LIGHTNING, start)
    assert match, f"no ```{lang} block after {marker!r} in docs/how-to/lightning.md"
    return match.group(1)


def _readme_app(folder: Path) -> Path:
    """Write the Lightning how-to's ``app.py`` and its ``conf/config.yaml`` into ``folder``."""
    code = _block_after("The task:", "python")
    assert "@hydra.main(" in code and 'config_name="config"' in code
    (folder / "app.py").write_text(code)
    (folder / "conf").mkdir()
    (folder / "conf" / "config.yaml").write_text(_block_after("with, in `conf/config.yaml`:", "yaml"))
    return folder / "app.py"


def test_c46_the_readme_has_cheap_commands_and_none_combines_multirun_with_cfg_or_info():
    commands = cheap_commands()
    assert "python app.py --cfg hydra" in commands, commands
    for command in commands:
        words = shlex.split(command)
        modes = [w for w in words if w in ("-m", "--multirun", "--cfg", "-c", "--info", "-i", "--run", "-r")]
        assert len(modes) <= 1, f"Hydra refuses {modes} together: {command}"


@pytest.mark.parametrize("command", cheap_commands())
def test_c46_each_cheap_readme_command_runs_as_written(tmp_path, command):
    """Run the command in a folder holding the Lightning how-to's app (or from the repository root for a repository
    script), with this interpreter for ``python``; it must exit 0. ``--cfg hydra`` must show the sweeper,
    its sampler and its pruner with their values (what the page says it prints); for a repository script, the
    sweeper."""
    words = shlex.split(command)
    script = words[1]
    if (REPO / script).is_file():
        cwd, path = REPO, REPO / script
    elif script == "app.py":
        cwd, path = tmp_path, _readme_app(tmp_path)
    else:
        pytest.fail(f"docs command {command!r} names {script}, which is neither a repository file nor app.py")
    res = run_command([sys.executable, str(path), *words[2:]], timeout_s=120, cwd=cwd, env=base_env())
    res.check()
    if "--cfg" in words and "hydra" in words:
        assert "_target_: hydra_plugins.ds_optuna_sweeper.sweeper.DSOptunaSweeper" in res.output, res.output[-3000:]
    if "--cfg" in words and "hydra" in words and script == "app.py":
        for line in ("_target_: hydra_plugins.ds_optuna_sweeper.sweeper.DSOptunaSweeper",
                     "_target_: optuna.samplers.TPESampler", "_target_: optuna.pruners.MedianPruner",
                     "direction: maximize", "n_trials: 12", "n_warmup_steps: 0"):
            assert line in res.output, (line, res.output[-3000:])
