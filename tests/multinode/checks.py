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


def assert_every_rank_agrees(recs: dict[tuple[int, int], dict], numbers, world: int = WORLD) -> None:
    """Every global rank of both hosts ran each trial in ``numbers`` with the same params and config, in a world
    of ``world`` ranks."""
    for n in numbers:
        per_rank = [recs.get((n, r)) for r in range(world)]
        assert all(per_rank), f"trial {n}: records of ranks {[r for r in range(world) if not per_rank[r]]} missing"
        assert all(r["world_size"] == world for r in per_rank), [r["world_size"] for r in per_rank]
        assert len({json.dumps(r["params"], sort_keys=True) for r in per_rank}) == 1, [r["params"] for r in per_rank]
        assert len({r["config_sha256"] for r in per_rank}) == 1, f"trial {n}: configs differ"


def ranks_by_host(nodes: list[Node], world: int = WORLD) -> dict[str, list[int]]:
    """``{host name: [global ranks]}`` from each node's ``ds_optuna: rank k/<world>`` start lines."""
    return {n.host.name: sorted({int(k) for k in re.findall(rf"ds_optuna: rank (\d+)/{world} ", n.output())})
            for n in nodes}


def assert_two_nodes(nodes: list[Node], per_node: int = 2) -> None:
    """The world was really spread over both hosts: ``per_node`` ranks on each, node rank 0 (ranks 0 to
    ``per_node - 1``) on one of them."""
    by_host = ranks_by_host(nodes, 2 * per_node)
    assert sorted(by_host.values()) == [list(range(per_node)), list(range(per_node, 2 * per_node))], by_host
