"""What a stack has made, written to its folder's state file before each thing is used.

``down`` runs in another process than ``up`` (the command line), and also after an ``up`` that
failed half-way; both only know what to undo because the names, ports and processes are on
disk first.
"""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Process:
    pid: int
    # /proc/<pid>/stat's start time: a pid that has been reused since is not ours to stop.
    started: int | None


@dataclass
class State:
    # The PostgreSQL role and database, and the Redis key prefix.
    name: str
    workers: list[int]
    port: int
    created_static_root: bool
    processes: dict[str, Process] = field(default_factory=dict)
    # The workers' server: daphne (chatsite@PORT) or uvicorn (chatsite-uvicorn@PORT).
    server: str = "daphne"


def save_state(path: Path, state: State) -> None:
    path.write_text(json.dumps(asdict(state), indent=2) + "\n")


def load_state(path: Path) -> State | None:
    """The state in ``path``; None if there is no stack."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    data["processes"] = {k: Process(**v) for k, v in data["processes"].items()}
    return State(**data)
