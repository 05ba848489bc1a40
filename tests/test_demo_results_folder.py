"""`make demo` leaves the committed demo result alone (issue 38, C59).

A new user's first `make demo` rewrote the tracked ``bench/results/demo.md``/``.json``, after which
``tests/test_bench_results.py`` failed (the README's figures no longer matched). The demo now writes its table
into its own sweep dir and says where; only an explicit ``--results bench/results`` rewrites the committed one.
"""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _demo():
    spec = importlib.util.spec_from_file_location("demo", REPO / "examples" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    return demo


def test_the_demo_writes_its_table_into_its_sweep_dir_unless_asked(tmp_path):
    demo = _demo()
    sweep = tmp_path / "demo-sweep"
    for argv in ([], ["--nproc", "4"], ["--budget", "30", "--", "hydra.sweeper.n_jobs=2"]):
        assert demo.results_folder(demo.parse_args(argv).results, sweep) == sweep, argv
    assert demo.results_folder(demo.parse_args(["--results", "bench/results"]).results, sweep) == REPO / "bench" / "results"
    assert demo.results_folder(demo.parse_args(["--results", str(tmp_path / "x")]).results, sweep) == tmp_path / "x"
    assert demo.results_folder(demo.parse_args(["--results", ""]).results, sweep) is None


def test_the_demo_writes_the_files_there_and_says_where(tmp_path, capsys):
    demo = _demo()
    args = demo.parse_args([])
    timings = {"wall_s": 10, "user_s": 1, "system_s": 1, "search_s": 5, "refit_and_rest_s": 5,
               "load_average_before": 0.1, "states": {"COMPLETE": {"count": 1, "min_s": 5, "max_s": 5}}}
    before = {p.name: p.read_bytes() for p in (REPO / "bench" / "results").glob("demo.*")}
    out = demo.results_folder(args.results, tmp_path)
    demo._save(out, ["| table |"], timings, args, rows=[])
    assert (tmp_path / "demo.md").read_text().startswith("| table |") and (tmp_path / "demo.json").exists()
    assert str(tmp_path / "demo.md") in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in (REPO / "bench" / "results").glob("demo.*")} == before
