"""Read back what the trackers hold, with each tracker's own reader: ``MlflowClient``, TensorBoard's
``EventAccumulator``, and W&B's run files (its protobuf ``Record`` messages in the ``.wandb`` file)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any


def mlflow_runs(uri: str, experiment: str) -> list[Any]:
    """Every run of ``experiment`` in the store at ``uri`` (``mlflow.entities.Run``)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r} in {uri}"
    return client.search_runs([found.experiment_id], max_results=1000)


def mlflow_history(uri: str, run_id: str, key: str) -> dict[int, float]:
    """``{step: value}`` of one metric of one run."""
    from mlflow import MlflowClient

    return {m.step: m.value for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, key)}


def tensorboard_scalars(event_dir: Path) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` of every scalar in the event files of ``event_dir`` (one TensorBoard run)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(event_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


# W&B's .wandb file: a 7-byte header (":W&B", magic 0xBEE1, version), then LevelDB-log chunks in 32 KiB blocks,
# each chunk: crc32 (4 bytes), length (2, little endian), type (1: full, 2: first, 3: middle, 4: last), data.
_BLOCK = 32768


def _chunks(data: bytes):
    assert data[:4] == b":W&B", "not a W&B run file"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        body = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        if kind == 1:
            yield body
        elif kind == 2:
            pending = body
        elif kind == 3:
            pending += body
        elif kind == 4:
            yield pending + body
            pending = b""


def wandb_runs(wandb_dir: Path) -> dict[str, dict[str, Any]]:
    """``{run id: {"name", "group", "config", "history": [rows], "summary": {...}, "exit_codes": [...]}}`` from every
    ``offline-run-*/run-<id>.wandb`` below ``wandb_dir`` (W&B writes one folder per ``wandb.init``; those of one
    id are one run)."""
    from wandb.proto import wandb_internal_pb2 as pb

    runs: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(wandb_dir).glob("*run-*/run-*.wandb")):
        run_id = path.stem[len("run-"):]
        run = runs.setdefault(run_id, {"name": None, "group": None, "config": {}, "history": [], "summary": {},
                                       "exit_codes": []})
        for chunk in _chunks(path.read_bytes()):
            rec = pb.Record()
            rec.ParseFromString(chunk)
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                run["name"], run["group"] = rec.run.display_name, rec.run.run_group
                run["config"].update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
            elif kind == "config":
                run["config"].update({i.key: json.loads(i.value_json) for i in rec.config.update})
            elif kind == "history":
                run["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                       for i in rec.history.item})
            elif kind == "summary":
                run["summary"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                       for i in rec.summary.update})
            elif kind == "exit":
                run["exit_codes"].append(rec.exit.exit_code)
    return runs
