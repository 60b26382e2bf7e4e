"""Ray for `--executor ray`: the connection, what a task asks for, and directories shipped to workers.

Ray is an optional extra (`pip install kernel-replay[ray]`): it is imported here, and only when a
command asks for it. `bisect/ray_probes.py` and `engine/fanout.py` build on this module.

Where workers find their files (`--ship`):
  shared  a path the driver gives is read where it is: a local Ray, or a mount every node sees
  ray     the directory travels as a tar through Ray's object store (put once), and each node
          unpacks it once, by digest, under its temporary directory; no shared disk is needed
  auto    shared on a Ray of one node, this machine's; ray otherwise
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import shutil
import signal
import socket
import tarfile
import tempfile
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

from replay.errors import ReplayError

RAY_EXTRA = "pip install kernel-replay[ray]"
EXECUTORS = ("local", "ray")
SHIP_CHOICES = ("auto", "ray", "shared")
CONNECT_SECONDS = 10
CLEANUP_SECONDS = 30  # at most this long removing what the workers unpacked, once the command is done


def import_ray() -> ModuleType:
    """Ray, or a one-line error naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise ReplayError(f"--executor ray needs Ray, which is not installed here: {RAY_EXTRA}") from None
    return ray


@contextlib.contextmanager
def connected(address: str | None, num_cpus: int) -> Iterator[ModuleType]:
    """Ray for the block: the one this process is connected to already, else the cluster at `address`,
    else a local Ray of `num_cpus` CPUs started for the block. What the block connected to, it leaves."""
    ray = import_ray()
    if ray.is_initialized():  # a caller's own Ray (a notebook, a test): theirs to shut down
        yield ray
        return
    if address:
        _reachable(address)
    sigterm = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    try:
        ray.init(address=address or "local", num_cpus=None if address else num_cpus, include_dashboard=False,
                 log_to_driver=False, logging_level=logging.ERROR)  # not Ray's notes on a local start
    except (ConnectionError, RuntimeError, ValueError) as exc:  # nothing there, or not a Ray
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ReplayError(f"--ray-address {address}: cannot connect to Ray ({first})") from None
    finally:
        if sigterm is not None:  # Ray's own handler exits at once: a bisect's unwinds, cleaning up
            signal.signal(signal.SIGTERM, sigterm)
    try:
        yield ray
    finally:
        ray.shutdown()


def _reachable(address: str) -> None:
    """Fail at once where nothing listens at `address`, which Ray itself would keep trying for minutes."""
    host, _, port = address.split("://")[-1].rpartition(":")
    if not host or not port.isdigit():
        return  # "auto", or a form Ray reads its own way
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise ReplayError(f"--ray-address {address}: nothing answers there ({exc.strerror or exc})") from None


def chosen_ship(ship: str) -> str:
    """`ray` or `shared`: `auto` is shared only where every worker is on this machine."""
    if ship != "auto":
        return ship
    ray = import_ray()
    if ray.util.client.ray.is_connected():  # Ray Client: this driver runs off the cluster
        return "ray"
    nodes = [node for node in ray.nodes() if node["Alive"]]
    here = ray.get_runtime_context().get_node_id()
    return "shared" if [node["NodeID"] for node in nodes] == [here] else "ray"


def task_resources() -> dict[str, float]:
    """One GPU a task where the cluster has GPUs (Ray then sets its CUDA_VISIBLE_DEVICES), else one CPU."""
    return {"num_gpus": 1} if import_ray().cluster_resources().get("GPU", 0) >= 1 else {"num_cpus": 1}


def task_slots() -> int:
    """How many tasks of task_resources() the cluster runs at once."""
    resources = import_ray().cluster_resources()
    return int(resources.get("GPU", 0)) or max(1, int(resources.get("CPU", 1)))


def describe_cluster() -> str:
    """'3 CPUs, 0 GPUs on 1 node', for progress."""
    ray = import_ray()
    resources = ray.cluster_resources()
    nodes = sum(node["Alive"] for node in ray.nodes())
    return (f"{resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs on {nodes} "
            f"node{'s' if nodes != 1 else ''}")


def cancel_all(refs: list[Any]) -> None:
    """Cancel tasks still pending or running: a running one gets KeyboardInterrupt, so it can end
    what it started (a probe's process tree), and a dead or finished one is left as it is, never
    cancelled: Ray 2.60 aborts the driver when a cancel meets the reply of a finished task (a
    failed check in its task manager, seen in this project's CI). A task that finishes between
    the look and the cancel can still meet it: the window is narrowed, not closed."""
    if not refs:
        return
    ray = import_ray()
    with contextlib.suppress(Exception):  # the cluster gone: nothing left to cancel
        _, unfinished = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        for ref in unfinished:
            with contextlib.suppress(Exception):  # finished meanwhile, or its worker gone
                ray.cancel(ref, force=False)


MAX_RETRIES = 1  # a task whose worker dies runs once more, elsewhere where Ray can; then it is untested
NOT_SHIPPED = frozenset({".git", ".venv", "venv", "__pycache__", ".mypy_cache", ".pytest_cache", ".tox",
                         "node_modules"})  # never code or data a replay reads
MAX_SHIP_BYTES = 4 << 30  # packed in this process's memory before it is put


@dataclass(frozen=True)
class ShippedTree:
    """A directory in Ray's object store, as a tar: unpacked once per node, by digest, under `folder`.

    Held inside another argument, its ref is not fetched by Ray before the task runs: a node that
    has it unpacked already never fetches it again."""

    digest: str
    ref: Any  # ray.ObjectRef of the tar's bytes
    folder: str  # the command's folder in each node's temporary directory


class Shipment:
    """The directories one command ships (`--ship ray`): each put once; on close, what the nodes
    unpacked is removed."""

    def __init__(self) -> None:
        self.folder = f"replay-ray-{uuid.uuid4().hex[:12]}"
        self._trees: dict[Path, ShippedTree] = {}
        self._lock = threading.Lock()

    def tree(self, path: Path) -> ShippedTree:
        """`path`'s directories and regular files (no links, devices, FIFOs) in the object store."""
        with self._lock:
            if path not in self._trees:
                data = pack_directory(path)
                self._trees[path] = ShippedTree(hashlib.sha256(data).hexdigest(), import_ray().put(data), self.folder)
            return self._trees[path]

    def close(self) -> None:
        """Remove what the tasks unpacked: here, and by a task on each other live node, waited for a while."""
        if not self._trees:
            return
        ray = import_ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        _remove_folder(self.folder)
        here = ray.get_runtime_context().get_node_id()
        others = [node["NodeID"] for node in ray.nodes() if node["Alive"] and node["NodeID"] != here]
        if not others:
            return
        cleanup = ray.remote(num_cpus=0, max_retries=0)(_remove_folder)
        refs = [cleanup.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                .remote(self.folder) for node in others]
        with contextlib.suppress(Exception):  # best effort: a node gone, or busy past the wait
            ray.wait(refs, num_returns=len(refs), timeout=CLEANUP_SECONDS)


def pack_directory(path: Path) -> bytes:
    """`path` as a tar: its directories and regular files, but not what no replay reads (a `.git`, a
    virtual environment, caches: `--code .` is a repository's root); more than MAX_SHIP_BYTES is refused."""
    buffer = io.BytesIO()
    size = 0
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for item in sorted(path.rglob("*")):
            if item.is_symlink() or not (item.is_file() or item.is_dir()):
                continue  # a snapshot is read through regular files only (snapshot/confined.py)
            if NOT_SHIPPED.intersection(item.relative_to(path).parts):
                continue
            size += item.stat().st_size if item.is_file() else 0
            if size > MAX_SHIP_BYTES:
                raise ReplayError(f"{path}: more than {MAX_SHIP_BYTES >> 30} GiB to send through Ray's object store; "
                                  "give --ship shared and a path every node sees")
            tar.add(item, arcname=item.relative_to(path).as_posix(), recursive=False)
    return buffer.getvalue()


def unpack(data: bytes, destination: Path) -> None:
    """Extract a tar made here (a packed directory, or `git archive`): nothing lands outside `destination`."""
    if not hasattr(tarfile, "data_filter"):
        raise ReplayError("--ship ray needs Python 3.10.12 or later (tarfile's data filter)")
    destination.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(destination, filter="data")


def unpacked(tree: ShippedTree) -> Path:
    """On a worker: the folder holding `tree`, unpacked by the first task on this node that needs it."""
    root = Path(tempfile.gettempdir()) / tree.folder
    root.mkdir(exist_ok=True)
    target = root / tree.digest
    if target.is_dir():
        return target
    staging = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=root))
    unpack(import_ray().get(tree.ref), staging)
    try:
        staging.rename(target)  # whole or not at all: a task beside this one may be unpacking it too
    except OSError:  # it won: use its copy
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _remove_folder(folder: str) -> None:
    shutil.rmtree(Path(tempfile.gettempdir()) / folder, ignore_errors=True)
