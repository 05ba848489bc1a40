"""The documented figures come from committed results, and the GPU check never overwrites them (issue 20).

- Every block of the Performance page (``docs/performance.md``, the README's Performance section before issue 43;
  a block starts at a paragraph that opens with a bold title) and the demo's figures (in the README and in
  ``docs/getting-started.md``) cite at least one file under ``bench/results/``, and every number written in
  the block appears in the files it cites: a figure typed by hand, or left behind when a benchmark was re-run
  with other results, fails here. A block may also cite the benchmark itself (``bench/<name>.py``), whose
  docstring states its target, so that "target 3x" is found there.
- ``bench/gpu_check.py``'s overhead step writes under its own folder (``bench/results/gpu`` by default) and
  leaves ``bench/results/*`` byte for byte as they were (commit 23f0ad3 overwrote the CPU overhead table
  with a 1-rank GPU-check run, and the README cited a table that no longer existed).
- Result files name their command and machine, and hold no absolute path of the machine that made them.
"""

import hashlib
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
CITED = re.compile(r"bench/(?:results/[\w./-]+?\.(?:md|json)|\w+\.py)")
# A number as written in prose or a table: 1,076 / 0.8850 / 5e-05 / 1.91 (of 1.91x) / 19 (of 19%).
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:e-?\d+)?")


def performance_blocks(page: str) -> list[str]:
    """The Performance page cut at each paragraph that opens with a bold title (``**...**``)."""
    parts = re.split(r"\n\n(?=\*\*)", page)
    return [p for p in parts[1:] if p.strip()]


def demo_block(text: str, end: str) -> str:
    """The demo's figures: from "It ends with one table" to the line that starts with ``end``."""
    start = text.index("It ends with one table")
    return text[start:text.index(end, start)]


def numbers_in(block: str) -> list[str]:
    """Every number of ``block``, with the cited file names taken out first (their digits are no figures)."""
    block = CITED.sub(" ", block)
    return [n.replace(",", "") for n in NUMBER.findall(block)]


def missing_figures(block: str) -> tuple[list[str], list[str]]:
    """(cited files, numbers of ``block`` that none of them contains)."""
    cited = sorted(set(CITED.findall(block)))
    text = "\n".join((REPO / c).read_text() for c in cited if (REPO / c).exists())
    found = {n.replace(",", "") for n in NUMBER.findall(text)}
    return cited, [n for n in numbers_in(block) if n not in found]


def test_the_checker_catches_a_figure_typed_by_hand():
    """The oracle itself: a block whose figure is not in the cited file is reported, one whose figures are is not."""
    block = "**Pruning** (`bench/results/pruning.md`): pruning saved **19% of the optimizer steps**"
    assert missing_figures(block) == (["bench/results/pruning.md"], [])
    assert missing_figures(block.replace("19%", "23.7%"))[1] == ["23.7"]
    assert missing_figures("**X** no file cited, 4.2 s") == ([], ["4.2"])
    # a target stated in the benchmark's docstring is found there
    assert missing_figures("**Y** `bench/results/vs_relaunch.md`, target 3x (`bench/vs_relaunch.py`)")[1] == []
    assert missing_figures("**Y** `bench/results/vs_relaunch.md`, target 3x")[1] == ["3"]


def test_every_performance_figure_is_in_the_file_it_cites():
    blocks = performance_blocks((REPO / "docs" / "performance.md").read_text())
    assert len(blocks) >= 5, "the Performance page lost its blocks (split at bold title lines)"
    demos = [demo_block((REPO / "README.md").read_text(), "Pass Hydra overrides with"),
             demo_block((REPO / "docs" / "getting-started.md").read_text(), "`make install` does the install alone")]
    problems = []
    for block in blocks + demos:
        title = block.strip().splitlines()[0][:60]
        cited, missing = missing_figures(block)
        if numbers_in(block) and not any(c.startswith("bench/results/") for c in cited):
            problems.append(f"{title!r}: figures but no bench/results/ file cited")
        for c in cited:
            if not (REPO / c).exists():
                problems.append(f"{title!r}: cites {c}, which does not exist")
        if cited and missing:
            problems.append(f"{title!r}: {missing} not in {cited}")
    assert not problems, "\n".join(problems)


def test_result_files_name_their_command_and_machine_and_no_absolute_path():
    problems = []
    for md in sorted(RESULTS.rglob("*.md")):
        text = md.read_text()
        rel = md.relative_to(REPO)
        if "Command: `" not in text:
            problems.append(f"{rel}: no 'Command: `...`' line")
        if "Machine:" not in text and "Environment:" not in text:
            problems.append(f"{rel}: no machine line")
    for f in sorted(RESULTS.rglob("*")):
        if f.is_file() and f.suffix in (".md", ".json"):
            for bad in (str(REPO), "/tmp/", "/home/", "/root/"):
                if bad in f.read_text():
                    problems.append(f"{f.relative_to(REPO)}: holds the absolute path {bad!r}")
    assert not problems, "\n".join(problems)


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*")) if p.is_file()}


@pytest.mark.soak  # the lean net's 12 min; make test keeps the result files' checks (above)
@pytest.mark.torchrun
@pytest.mark.timeout(300)
def test_gpu_check_overhead_step_writes_only_under_its_own_folder(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    before = _digests(RESULTS)
    out = tmp_path / "gpu"
    rc = gpu_check.run_overhead(1, out, gpu=False, trials=5, timeout_s=200)
    assert rc == 0, (out / "overhead_1rank.txt").read_text()[-3000:]
    assert _digests(RESULTS) == before, "bench/gpu_check.py changed bench/results/ (the CPU results the docs cite)"
    assert {"overhead_1rank.md", "overhead_1rank.json", "overhead_1rank.txt"} <= set(_digests(out))
    assert "| 1 | sqlite |" in (out / "overhead_1rank.md").read_text()
