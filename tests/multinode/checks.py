"""What a two-node sweep of ``examples/ddp_mlp.py`` left behind, read back for the tests' assertions."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.multinode.launch import Node

WORLD = 4  # 2 hosts x 2 ranks


def ddp_records(record_dir: Path) -> dict[tuple[int, int], dict]:
    """``{(trial number, global rank): record}`` that ``examples/ddp_mlp.py`` wrote with ``DSO_RECORD_DIR``."""
    out = {}
    for f in sorted(record_dir.glob("trial*_rank*.json")):
        r = json.loads(f.read_text())
        out[(r["trial_number"], r["rank"])] = r
    return out


def assert_every_rank_agrees(recs: dict[tuple[int, int], dict], numbers) -> None:
    """Every global rank of both hosts ran each trial in ``numbers`` with the same params and config, in a world
    of :data:`WORLD` ranks."""
    for n in numbers:
        per_rank = [recs.get((n, r)) for r in range(WORLD)]
        assert all(per_rank), f"trial {n}: records of ranks {[r for r in range(WORLD) if not per_rank[r]]} missing"
        assert all(r["world_size"] == WORLD for r in per_rank), [r["world_size"] for r in per_rank]
        assert len({json.dumps(r["params"], sort_keys=True) for r in per_rank}) == 1, [r["params"] for r in per_rank]
        assert len({r["config_sha256"] for r in per_rank}) == 1, f"trial {n}: configs differ"


def ranks_by_host(nodes: list[Node]) -> dict[str, list[int]]:
    """``{host name: [global ranks]}`` from each node's ``ds_optuna: rank k/4`` start lines."""
    return {n.host.name: sorted({int(k) for k in re.findall(rf"ds_optuna: rank (\d+)/{WORLD} ", n.output())})
            for n in nodes}


def assert_two_nodes(nodes: list[Node]) -> None:
    """The world was really spread over both hosts: two ranks on each, node rank 0 (ranks 0-1) on one of them."""
    by_host = ranks_by_host(nodes)
    assert sorted(by_host.values()) == [[0, 1], [2, 3]], by_host
