"""Seeded mutations of a snapshot, every kind of file it has, for the fuzz test and
scripts/fuzz_snapshots.py: the manifest, the index, call files (their JSON description, their
safetensors header, their bytes), blobs, chunk lists and packs of chunks. A mutated file is
re-signed wherever a digest would otherwise stop the reader first (the index's sha256 of a call
file; a blob's name, and every chunk list and call that names it), so that the deep parsers are
reached; a pack is named by number, so its header is reached as mutated.

    path = record(directory / "pristine")
    case = mutate(copy_of_path, random.Random(seed))    # what was done, in words
    outcome = check(copy_of_path)                        # exit codes, or the failure found
"""
from __future__ import annotations

import hashlib
import json
import random
import struct
from pathlib import Path
from typing import Any, Callable

import torch
from click.testing import CliRunner

import replay
from replay.cli import main as cli_main

PROVIDER = __name__
ALLOWED_EXITS = (0, 1, 2, 125)
KINDS = ("manifest", "index", "call description", "call header", "call bytes", "blob", "chunk list", "chunk")


@replay.capture("fuzz_write", state=("position_buf",), mutates=("cache",))
def write(x: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor, position_buf: torch.Tensor,
          factor: float = 2.0, shape: tuple = (1, 2), ceiling: float = float("inf")) -> torch.Tensor:
    replay.tag("scaled", x * factor)
    cache[position_buf.long(), : x.shape[-1]] = x * factor
    return (x * factor + weight[: x.shape[-1]]).clamp(max=ceiling)


def record(path: Path) -> Path:
    """Three calls: a strided view with an offset, a blob (the weight), a cache in 64 KiB chunks it
    writes a row of each call (state and mutated), a tag, JSON arguments of every kind."""
    weight, cache = torch.arange(64.0), torch.zeros(64, 1024)
    with replay.recording(path, blob_threshold=128, chunk_threshold=1):
        for step in range(3):
            base = torch.arange(40.0).reshape(5, 8) + step
            write(base[1:4, ::2], weight, cache, torch.arange(3, dtype=torch.int32) + 3 * step, factor=2.5)
    return path


# values a field is replaced with: edges of each JSON type, and what the format gives meaning to
INTERESTING: list[Any] = [
    0, -1, 1, 2 ** 31, -2 ** 31, 2 ** 40 + 1, 2 ** 63, 10 ** 30, 0.5, -0.0, 1e308, "OVERFLOW", None, True, False,
    "", "x" * 5000, "\ud800", "a\x1b[2J", "../../etc/passwd", "calls/../manifest.json", "/dev/zero", [], {},
    json.loads("[" * 70 + "]" * 70), [0] * 100, {"$float": [1]}, {"$float": "nan"}, {"$tuple": 5},
    {"$x": 1}, "float32", "uint8", "0" * 64, "f" * 64, [2 ** 20, 2 ** 20], [0, 0, 0], [-1],
]


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in a JSON value: the value itself, each key's and each item's."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for n, item in enumerate(value):
            found += _paths(item, prefix + (n,))
    return found


def mutate_json(value: Any, rng: random.Random) -> tuple[Any, str]:
    """One change somewhere in `value`: a field replaced, removed or doubled; a list item repeated."""
    path = rng.choice(_paths(value))
    if not path:
        return rng.choice(INTERESTING), "the whole document replaced"
    parent = value
    for step in path[:-1]:
        parent = parent[step]
    key = path[-1]
    how = rng.choice(["replace", "replace", "replace", "remove", "repeat"])
    if how == "remove":
        del parent[key]
    elif how == "repeat" and isinstance(parent, list):
        parent[key + 1:key + 1] = [parent[key]] * rng.choice([1, 2, 1000])
    else:
        parent[key] = rng.choice(INTERESTING)
    return value, f"{how} at {'/'.join(map(str, path))}"


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Bits flipped, a cut, bytes inserted or a run overwritten, somewhere in `data`."""
    at = rng.randrange(max(len(data), 1))
    how = rng.choice(["flip", "cut", "insert", "overwrite"])
    if how == "flip":
        changed = bytearray(data)
        if changed:
            changed[at] ^= 1 << rng.randrange(8)
        data = bytes(changed)
    elif how == "cut":
        data = data[:at]
    elif how == "insert":
        data = data[:at] + bytes(rng.randrange(256) for _ in range(rng.choice([1, 8, 100]))) + data[at:]
    else:
        run = rng.choice([1, 8, 64])
        data = data[:at] + rng.choice([b"\xff", b"\x00", b"9"]) * run + data[at + run:]
    return data, f"{how} at byte {at}"


def _dumps(value: Any) -> str:
    # "OVERFLOW" stands for a number no float holds (json.dumps cannot write one)
    return json.dumps(value).replace('"OVERFLOW"', "1e999")


def _index(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "calls.jsonl").read_text().splitlines()]


def _split(data: bytes) -> tuple[dict[str, Any], bytes]:
    (size,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + size]), data[8 + size:]


def _join(header: dict[str, Any], body: bytes) -> bytes:
    head = _dumps(header).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + body


def _resign_calls(path: Path, entries: list[dict[str, Any]], old: str | None = None, new: str | None = None) -> None:
    """Every call file's index line made to vouch for its bytes again, after `old` (a blob digest)
    became `new` in the call descriptions that name it."""
    for entry in entries:
        file = path / entry.get("file", "")
        if not isinstance(entry.get("file"), str) or not file.is_file():
            continue
        data = file.read_bytes()
        if old is not None and old.encode() in data:
            header, body = _split(data)
            header["__metadata__"] = {key: text.replace(old, new) for key, text in header["__metadata__"].items()}
            data = _join(header, body)
            file.write_bytes(data)
            entry["blobs"] = [new if b == old else b for b in entry.get("blobs", [])]
        entry.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (path / "calls.jsonl").write_text("".join(_dumps(e) + "\n" for e in entries))


def _rename_blob(path: Path, old: str, data: bytes) -> str:
    """Blob `old` is now `data`: stored under its own digest, and every chunk list and call that
    named `old` names the new one (a list so changed is renamed in turn)."""
    new = hashlib.sha256(data).hexdigest()
    (path / "blobs" / f"{new}.safetensors").write_bytes(data)
    for blob in list((path / "blobs").iterdir()):
        content = blob.read_bytes()
        if blob.stem not in (old, new) and bytes.fromhex(old) in content:
            _rename_blob(path, blob.stem, content.replace(bytes.fromhex(old), bytes.fromhex(new)))
    _resign_calls(path, _index(path), old, new)
    return new


def _width(blob: Path) -> int | None:
    """A chunk list's row width (32: format 2, 36: format 3), or None for another blob."""
    header, _ = _split(blob.read_bytes())
    shape = header.get("data", {}).get("shape", [])
    return shape[1] if len(shape) == 2 and shape[1] in (32, 36) else None


def _blobs(path: Path, chunk_lists: bool) -> list[Path]:
    """The blobs that are chunk lists (their data a [pieces, 32] or [pieces, 36] table), or the others."""
    return [blob for blob in sorted((path / "blobs").iterdir()) if (_width(blob) is not None) == chunk_lists]


def _chunk_list(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A chunk list's entries repeated, dropped, reordered, or one made a digest nothing has (or,
    in a packed list, a pack that does not exist)."""
    header, body = _split(data)
    width = header["data"]["shape"][1]
    rows = [body[i:i + width] for i in range(0, len(body), width)]
    how = rng.choice(["repeat", "drop", "shuffle", "unknown"] + (["no such pack"] if width > 32 else []))
    if how == "repeat":
        rows = rows + [rng.choice(rows)] * rng.choice([10, 5000, 40_000])
    elif how == "drop":
        rows = rows[: rng.randrange(len(rows))]
    elif how == "shuffle":
        rng.shuffle(rows)
    elif how == "unknown":
        rows[rng.randrange(len(rows))] = bytes(width)
    else:
        at = rng.randrange(len(rows))
        rows[at] = rows[at][:32] + struct.pack("<I", rng.choice([99_999_999, 2**32 - 1]))
    header["data"]["shape"] = [len(rows), width]
    header["data"]["data_offsets"] = [0, width * len(rows)]
    return _join(header, b"".join(rows)), f"{how} ({len(rows)} entries)"


def mutate(path: Path, rng: random.Random) -> str:
    """One seeded mutation of the snapshot at `path`, re-signed; what was done, in words."""
    kind = rng.choice(KINDS)
    entries = _index(path)
    if kind == "manifest":
        manifest, how = mutate_json(json.loads((path / "manifest.json").read_text()), rng)
        (path / "manifest.json").write_text(_dumps(manifest))
    elif kind == "index":
        if rng.random() < 0.5:
            changed, how = mutate_json(entries, rng)
            text = "".join(_dumps(e) + "\n" for e in changed) if isinstance(changed, list) else _dumps(changed)
        else:
            text, how = mutate_bytes((path / "calls.jsonl").read_bytes(), rng)
            text = text.decode("utf-8", "surrogateescape")
        (path / "calls.jsonl").write_bytes(text.encode("utf-8", "surrogateescape"))
    elif kind in ("call description", "call header", "call bytes"):
        entry = rng.choice(entries)
        file = path / entry["file"]
        header, body = _split(file.read_bytes())
        if kind == "call description":
            key = entry["call"] + "replay.call"  # the call's description, among its segment's
            call, how = mutate_json(json.loads(header["__metadata__"][key]), rng)
            header["__metadata__"][key] = _dumps(call)
            data = _join(header, body)
        elif kind == "call header":
            header, how = mutate_json(header, rng)
            data = _join(header, body) if isinstance(header, dict) else _dumps(header).encode()
        else:
            data, how = mutate_bytes(_join(header, body), rng)
        file.write_bytes(data)
        _resign_calls(path, entries)
        how = f"{entry['file']}: {how}"
    elif kind == "chunk" and (path / "packs").is_dir():  # format 3: a pack, named by number, mutated as it is
        pack = rng.choice(sorted((path / "packs").iterdir()))
        data, how = mutate_bytes(pack.read_bytes(), rng)
        pack.write_bytes(data)
        how = f"{pack.name}: {how}"
    else:
        pool = _blobs(path, chunk_lists=kind == "chunk list")
        if kind == "chunk":
            listed = {bytes(row).hex() for blob in _blobs(path, True) for row in _rows(blob)}
            pool = [blob for blob in pool if blob.stem in listed]
        blob = rng.choice(pool)
        data, how = (_chunk_list if kind == "chunk list" else mutate_bytes)(blob.read_bytes(), rng)
        _rename_blob(path, blob.stem, data)
        how = f"{blob.stem[:12]}: {how}"
    return f"{kind}: {how}"


def _rows(blob: Path) -> list[bytes]:
    """A chunk list's digests."""
    _, body = _split(blob.read_bytes())
    width = _width(blob) or 32
    return [body[i:i + 32] for i in range(0, len(body), width)]


def check(path: Path, call: int, run: Callable[[list[str]], Any] | None = None) -> list[str]:
    """`replay show` and `replay run --call K` on the snapshot at `path`: what is wrong with how they
    ended (an exit outside 0, 1, 2, 125; a traceback; an internal error), or [] when nothing is."""
    invoke = run or (lambda args: CliRunner().invoke(cli_main, args))
    wrong = []
    # on the CPU: a mutated index tensor is an IndexError there, where a GPU would assert on the
    # device and leave its context unusable for the rest of the process
    replaying = ["run", str(path), "--call", str(call), "--provider", PROVIDER, "--device", "cpu"]
    for args in (["show", str(path)], replaying):
        result = invoke(args)
        output = result.output
        if result.exit_code not in ALLOWED_EXITS:
            wrong.append(f"{args[0]}: exit {result.exit_code}: {output.strip().splitlines()[-1:] or ''}")
        if "Traceback" in output or "internal error" in output:
            wrong.append(f"{args[0]}: {' '.join(output.split())[-300:]}")
    return wrong
