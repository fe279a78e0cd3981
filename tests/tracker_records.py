"""Reading back what the trackers wrote: wandb's offline run files, trackio's local store."""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_BLOCK = 32768  # the .wandb file is a LevelDB-style log of protobuf Records, in 32 KiB blocks
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path):
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb transaction log"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        if pos + 7 + length > len(data):  # still being written
            return
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk


def _finished_records(path: Path, pb, timeout_s: float = 30.0) -> list:
    """The run's records once its exit record is on disk: wandb-core writes the file after run.finish() returns."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = []
        for raw in _records(path):
            record = pb.Record()
            record.ParseFromString(raw)
            records.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


@dataclass
class WandbRun:
    run_id: str
    project: str
    name: str
    config: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    """One dict per logged row, "_step" included; tables as their row lists under their key."""


@dataclass
class WandbRecords:
    root: Path

    def runs(self) -> list[WandbRun]:
        """Every offline run under root (a resume is another offline-run folder with the same id), oldest first."""
        from wandb.proto import wandb_internal_pb2 as pb

        out = []
        for run_dir in sorted(self.root.rglob("offline-run-*")):
            (log_file,) = run_dir.glob("run-*.wandb")
            run: WandbRun | None = None
            for record in _finished_records(log_file, pb):
                kind = record.WhichOneof("record_type")
                if kind == "run":
                    config = {i.key: json.loads(i.value_json) for i in record.run.config.update}
                    run = WandbRun(record.run.run_id, record.run.project, record.run.display_name, config)
                elif kind == "config" and run is not None:
                    run.config.update({i.key: json.loads(i.value_json) for i in record.config.update})
                elif kind == "history" and run is not None:
                    run.history.append(self._row(record.history.item, run_dir / "files"))
            assert run is not None, f"{log_file} holds no run record"
            out.append(run)
        return out

    @staticmethod
    def _row(items, files: Path) -> dict[str, Any]:
        flat = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items}
        row: dict[str, Any] = {}
        for key, value in flat.items():
            if key.endswith("/_type") and value == "table-file":
                table = key[: -len("/_type")]
                data = json.loads((files / flat[f"{table}/path"]).read_text())
                row[table] = [dict(zip(data["columns"], r, strict=True)) for r in data["data"]]
        for key, value in flat.items():
            if not any(key.startswith(t + "/") for t in row):
                row[key] = value
        return row


def trackio_logs(project: str, run: str) -> list[dict[str, Any]]:
    """Every row trackio stored for the run; tables as their row lists."""
    from trackio.sqlite_storage import SQLiteStorage

    rows = []
    for row in SQLiteStorage.get_logs(project, run):
        rows.append(
            {k: (v["_value"] if isinstance(v, dict) and v.get("_type") == "trackio.table" else v) for k, v in row.items()}
        )
    return rows
