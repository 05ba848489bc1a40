"""The ``soak`` marker (issue 39): soak tests stay out of ``make test`` and run under ``make soak``."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOAK = "test_eight_groups_of_one_rank_on_the_default_storage_twenty_launches_in_a_row"


def _collected(*args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "tests/multirank/test_trial_groups.py", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_soak_tests_are_deselected_unless_the_mark_expression_names_soak():
    plain = _collected()
    assert SOAK not in plain and "test_two_groups_of_two_ranks_agree_within_each_group" in plain
    assert "3 deselected" in plain  # the 8 x 20 launches, SIGTERM with groups, two single-rank groups
    soak = _collected("-m", "soak")
    assert SOAK in soak and "test_two_groups_of_two_ranks_agree_within_each_group" not in soak
    assert SOAK in _collected("-m", "soak or not soak")
