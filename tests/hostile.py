"""A generator of hostile snapshots: a small real recording, then mutations of its manifest, index,
call metadata, safetensors headers and files, by type and by size, each re-signed where the
index's sha256 would otherwise stop the reader before the mutation is seen."""
from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any, Callable

import torch

import replay

PROVIDER = __name__
FIRST_CALL = "c000000/replay.call"  # the first call's description, in its segment's metadata


@replay.capture("hostile_scale", state=("position_buf",))
def scale(x: torch.Tensor, weight: torch.Tensor, position_buf: torch.Tensor, factor: float = 2.0,
          shape: tuple = (1, 2), ceiling: float = float("inf")) -> torch.Tensor:
    replay.tag("scaled", x * factor)
    return (x * factor + weight[: x.shape[-1]]).clamp(max=ceiling)


def record(path: Path) -> Path:
    """Two calls: views with strides and an offset, a blob (the weight), state, a tag, JSON arguments;
    each in a segment of its own, so that a mutation of the first call's leaves the second readable."""
    weight = torch.arange(64.0)
    with replay.recording(path, blob_threshold=128):
        for _ in range(2):
            base = torch.arange(40.0).reshape(5, 8)
            scale(base[1:4, ::2], weight, torch.arange(4, dtype=torch.int32), factor=2.5)
            replay.flush()
    return path


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "calls.jsonl").read_text().splitlines()]


def write_lines(path: Path, entries: list[Any]) -> None:
    (path / "calls.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))


def edit_index(edit: Callable[[dict[str, Any]], Any]) -> Callable[[Path], Path]:
    """Mutate the first index line (`edit` changes it in place, or returns its replacement)."""
    def mutate(path: Path) -> Path:
        entries = lines(path)
        replaced = edit(entries[0])
        entries[0] = entries[0] if replaced is None else replaced
        write_lines(path, entries)
        return path / "calls.jsonl"
    return mutate


def edit_manifest(edit: Callable[[dict[str, Any]], Any]) -> Callable[[Path], Path]:
    def mutate(path: Path) -> Path:
        manifest = json.loads((path / "manifest.json").read_text())
        replaced = edit(manifest)
        (path / "manifest.json").write_text(json.dumps(manifest if replaced is None else replaced))
        return path / "manifest.json"
    return mutate


def raw_manifest(text: str) -> Callable[[Path], Path]:
    def mutate(path: Path) -> Path:
        (path / "manifest.json").write_text(text)
        return path / "manifest.json"
    return mutate


def raw_index_line(text: str) -> Callable[[Path], Path]:
    def mutate(path: Path) -> Path:
        (path / "calls.jsonl").write_text(text + "\n")
        return path / "calls.jsonl"
    return mutate


def _split(data: bytes) -> tuple[dict[str, Any], bytes]:
    (size,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + size]), data[8 + size:]


def _join(header: dict[str, Any] | str, body: bytes) -> bytes:
    head = (header if isinstance(header, str) else json.dumps(header)).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + body


def resign(path: Path, entry_number: int, data: bytes) -> None:
    """Write call file bytes and make the index vouch for them (sha256, bytes)."""
    entries = lines(path)
    (path / entries[entry_number]["file"]).write_bytes(data)
    entries[entry_number].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    write_lines(path, entries)


def edit_call_file(edit: Callable[[dict[str, Any], bytes], tuple[dict[str, Any] | str, bytes]]
                   ) -> Callable[[Path], Path]:
    """Mutate the first call file's safetensors header and data (`edit(header, body)` returns both), re-signed."""
    def mutate(path: Path) -> Path:
        rel = lines(path)[0]["file"]
        resign(path, 0, _join(*edit(*_split((path / rel).read_bytes()))))
        return path / rel
    return mutate


def edit_call(edit: Callable[[dict[str, Any]], Any]) -> Callable[[Path], Path]:
    """Mutate the first call's replay.call metadata (in place, or return its replacement)."""
    def change(header: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes]:
        call = json.loads(header["__metadata__"][FIRST_CALL])
        replaced = edit(call)
        # "OVERFLOW" stands for a number no float holds (json.dumps cannot write one)
        header["__metadata__"][FIRST_CALL] = json.dumps(call if replaced is None else replaced).replace(
            '"OVERFLOW"', "1e999")
        return header, body
    return edit_call_file(change)


def output_buffer(mask_stored: bool = True, argument: bool = False, **changes: Any) -> Callable[[Path], Path]:
    """The first call given an output buffer `in/out` made from `out/out` and the mask `kept/out`
    (format 5), whose bytes are the tag's (12 float32s: no mask) or not there at all; `changes` to
    `in/out`'s geometry; with `argument`, an argument naming the mask."""
    def change(header: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes]:
        call = json.loads(header["__metadata__"][FIRST_CALL])
        if mask_stored:
            call["tensors"]["kept/out"] = call["tensors"].pop("tag/scaled")
        call["tensors"]["in/out"] = dict(call["tensors"]["out/out"], **changes,
                                         before={"after": "out/out", "unchanged": "kept/out"})
        if argument:
            call["args"].append({"name": "mask", "tensor": "kept/out"})
        header["__metadata__"][FIRST_CALL] = json.dumps(call)
        if mask_stored:
            header["c000000/kept/out"] = header.pop("c000000/tag/scaled")
        return header, body
    return edit_call_file(change)


def raw_call_metadata(text: str) -> Callable[[Path], Path]:
    return edit_call_file(lambda header, body: ({**header, "__metadata__": {FIRST_CALL: text}}, body))


def raw_safetensors_header(text: str) -> Callable[[Path], Path]:
    return edit_call_file(lambda header, body: (text, body))


def replace_file(rel: str, make: Callable[[Path], Any]) -> Callable[[Path], Path]:
    """Put something else (`make(path)`: a directory, a FIFO, a link) where snapshot file `rel` was."""
    def mutate(path: Path) -> Path:
        target = path / rel
        target.unlink()
        make(target)
        return target
    return mutate


def replace_call_file(make: Callable[[Path], Any]) -> Callable[[Path], Path]:
    """The same for the first call's file."""
    return lambda path: replace_file(lines(path)[0]["file"], make)(path)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def geometry(key: str, **changes: Any) -> Callable[[dict[str, Any]], None]:
    def edit(call: dict[str, Any]) -> None:
        call["tensors"][key].update(changes)
    return edit


def outside_file(path: Path) -> Path:
    secret = path.parent / "outside-the-snapshot.txt"
    secret.write_text("not yours")
    return secret


# name -> (mutation, what the one-line error must say)
HOSTILE: dict[str, tuple[Callable[[Path], Path], str]] = {
    # manifest: wrong JSON types, sizes, literals, depth
    "argument a $float wrapping a list": (edit_call(lambda c: c["args"][3].update(json={"$float": [1]})),
                                          "malformed wrapper"),
    "manifest notes a lone surrogate": (edit_manifest(lambda m: m.update(notes="note \ud800")), "lone surrogate"),
    "manifest created a lone surrogate": (edit_manifest(lambda m: m.update(created="\udfff")), "lone surrogate"),
    "manifest device a lone surrogate": (edit_manifest(lambda m: m["environment"].update(device="\ud800")),
                                         "lone surrogate"),
    "manifest capture_errors a lone surrogate": (edit_manifest(lambda m: m.update(capture_errors=["\ud800"])),
                                                 "lone surrogate"),
    "index op a lone surrogate": (edit_index(lambda e: e.update(op="\ud800")), "lone surrogate"),
    "index file a lone surrogate": (edit_index(lambda e: e.update(file="calls/\ud800.safetensors")),
                                    "lone surrogate"),
    "call op a lone surrogate": (edit_call(lambda c: c.update(op="\ud800")), "lone surrogate"),
    "call variant a lone surrogate": (edit_call(lambda c: c.update(variant="\udbff")), "lone surrogate"),
    "argument name a lone surrogate": (edit_call(lambda c: c["args"][0].update(name="\ud800")), "lone surrogate"),
    "manifest environment a list": (edit_manifest(lambda m: m.update(environment=[1, 2])), "environment"),
    "manifest producer a string": (edit_manifest(lambda m: m.update(producer="me")), "producer"),
    "manifest capture_errors an int": (edit_manifest(lambda m: m.update(capture_errors=3)), "capture_errors"),
    "manifest git commit not hex": (edit_manifest(lambda m: m["producer"].update(git={"commit": "x;rm"})),
                                    "commit"),
    "manifest version a string": (edit_manifest(lambda m: m.update(format_version="1")), "format_version"),
    "manifest version a float": (raw_manifest('{"format_version": 1.5}'), "format_version"),
    "manifest number overflowing": (raw_manifest('{"format_version": 1e400}'), "overflows"),
    "manifest version a bool": (edit_manifest(lambda m: m.update(format_version=True)), "format_version"),
    "manifest NaN literal": (raw_manifest('{"format_version": 1, "notes": NaN}'), "NaN"),
    "manifest a list": (raw_manifest("[1, 2]"), "manifest"),
    "manifest nested deep": (raw_manifest('{"format_version": 1, "notes": ' + nested(100_000) + "}"), "deep"),
    "manifest nested a little too deep": (raw_manifest('{"format_version": 1, "x": ' + nested(70) + "}"), "deep"),
    "manifest not UTF-8": (replace_file("manifest.json", lambda t: t.write_bytes(b'{"format_version": 1, "n": "\xff"}')),
                           "manifest"),
    "manifest a directory": (replace_file("manifest.json", Path.mkdir), "regular file"),
    "manifest a FIFO": (replace_file("manifest.json", os.mkfifo), "regular file"),
    "manifest a link to /dev/zero": (replace_file("manifest.json", lambda t: t.symlink_to("/dev/zero")),
                                     "outside the snapshot"),
    "manifest too large": (lambda p: (os.truncate(p / "manifest.json", 17 << 20), p / "manifest.json")[-1], "bytes"),
    # index lines
    "index negative": (edit_index(lambda e: e.update(index=-1)), "index"),
    "index a float": (edit_index(lambda e: e.update(index=8.7)), "index"),
    "index huge": (edit_index(lambda e: e.update(index=10 ** 30)), "index"),
    "index a string": (edit_index(lambda e: e.update(index="0")), "index"),
    "index op a list": (edit_index(lambda e: e.update(op=["x"])), "op"),
    "index bytes huge": (edit_index(lambda e: e.update(bytes=10 ** 300)), "bytes"),
    "index bytes negative": (edit_index(lambda e: e.update(bytes=-5)), "bytes"),
    "index sha not hex": (edit_index(lambda e: e.update(sha256="z" * 64)), "sha256"),
    "index blobs an int": (edit_index(lambda e: e.update(blobs=7)), "blobs"),
    "index file with NUL": (edit_index(lambda e: e.update(file="calls/a\x00b")), "file"),
    "index file absolute": (edit_index(lambda e: e.update(file="/etc/passwd")), "file"),
    "index file dot-dot": (edit_index(lambda e: e.update(file="calls/../../x")), "file"),
    "index file a directory": (lambda p: (edit_index(lambda e: e.update(file="segments"))(p), p / "segments")[-1],
                               "regular file"),
    "index line a list": (edit_index(lambda e: [e]), "index line"),
    "index call another call's": (edit_index(lambda e: e.update(call="c000001/")), "another call's keys"),
    "index call not a call prefix": (edit_index(lambda e: e.update(call="../in/")), "call"),
    "index call in a segment without it": (lambda p: (write_lines(p, [dict(lines(p)[0], index=7, call="c000007/")]),
                                                      p / lines(p)[0]["file"])[-1], "holds no call c000007"),
    "segment tensor without a call prefix": (edit_call_file(lambda header, body: (
        {("in/x" if key.endswith("/in/x") else key): value for key, value in header.items()}, body)), "names no call"),
    "index line NaN literal": (raw_index_line('{"index": NaN}'), "NaN"),
    "index line nested deep": (raw_index_line(nested(100_000)), "deep"),
    "index duplicate": (lambda p: (write_lines(p, [lines(p)[0], lines(p)[0]]), p / "calls.jsonl")[-1],
                        "more than once"),
    "index a link to /dev/zero": (replace_file("calls.jsonl", lambda t: t.symlink_to("/dev/zero")),
                                  "outside the snapshot"),
    # files the index leads to
    "call file a link outside": (replace_call_file(lambda t: t.symlink_to(outside_file(t.parent.parent))),
                                 "outside the snapshot"),
    "call file a link to /dev/zero": (replace_call_file(lambda t: t.symlink_to("/dev/zero")), "outside the snapshot"),
    "call file a FIFO": (replace_call_file(lambda t: os.mkfifo(t)), "regular file"),
    "call file a directory": (replace_call_file(lambda t: t.mkdir()), "regular file"),
    "call file sparse": (lambda p: (edit_index(lambda e: e.update(bytes=3 << 30))(p),
                                    os.truncate(p / lines(p)[0]["file"], 3 << 30), p / lines(p)[0]["file"])[-1],
                         "sparse"),
    "call file grown": (lambda p: (os.truncate(p / lines(p)[0]["file"], 1 << 20), p / lines(p)[0]["file"])[-1],
                        "bytes"),
    # call metadata: shapes, numbers, literals, wrappers
    "shape a float": (edit_call(geometry("in/x", shape=[8.7])), "shape"),
    "shape a string": (edit_call(geometry("in/x", shape=["8"])), "shape"),
    "shape negative": (edit_call(geometry("in/x", shape=[-3, 4])), "shape"),
    "shape too many dims": (edit_call(geometry("in/x", shape=[1] * 40, stride=[1] * 40)), "shape"),
    "stride negative": (edit_call(geometry("in/x", stride=[-1, 1])), "stride"),
    "stride and shape differ in length": (edit_call(geometry("in/x", stride=[1])), "stride"),
    "storage offset huge": (edit_call(geometry("in/x", storage_offset=10 ** 20)), "storage_offset"),
    "broadcast view of 4e12 elements": (edit_call(geometry("state/position_buf", shape=[10 ** 6, 10 ** 6, 4],
                                                           stride=[0, 0, 1])), "refused"),
    "overlapping view of 28M elements": (edit_call(geometry("in/weight", shape=[3] * 15 + [2], stride=[1] * 15 + [33])),
                                         "refused"),
    "views of a call past its budget": (edit_call(lambda c: c["tensors"].update(
        {f"tag/wide{i}": {**c["tensors"]["in/weight"], "shape": [2 ** 16, 64], "stride": [0, 1]} for i in range(24)})),
        "views reach"),
    "dtype unknown": (edit_call(geometry("in/x", dtype="complex128")), "dtype"),
    "dtype a list": (edit_call(geometry("in/x", dtype=["float32"])), "dtype"),
    "blob not a digest": (edit_call(geometry("in/weight", blob="../../etc/passwd")), "blob"),
    "chunk edits a list": (edit_call(geometry("in/weight", chunk_edits=["edits/in/weight"])), "chunk_edits"),
    "chunk edits of no list": (edit_call(geometry("in/x", chunk_edits="edits/in/x")), "names chunk edits but no chunk list"),
    "chunk edits of another tensor": (edit_call(geometry("in/x", chunks="0" * 64, chunk_edits="edits/in/weight")),
                                      "its chunk edits must be 'edits/in/x'"),
    "edit list of no tensor": (edit_call(lambda c: c["tensors"].update({"edits/in/y": c["tensors"]["in/x"]})),
                               "is the edit list of no tensor's chunks"),
    "tensors a list": (edit_call(lambda c: c.update(tensors=[])), "tensors"),
    "tensor key without a role": (edit_call(lambda c: c["tensors"].update(x=c["tensors"]["in/x"])), "role"),
    "before not from its own output": (edit_call(geometry("in/x", before={"after": "out/out", "unchanged": "kept/x"})),
                                       "must be made from 'out/x' and 'kept/x'"),
    "before a string": (edit_call(geometry("in/x", before="out/out")), "before"),
    "before beside a blob": (output_buffer(blob="0" * 64), "both stored bytes and"),
    "before whose mask is not stored": (output_buffer(mask_stored=False), "'kept/out', which is not stored"),
    "before of another dtype": (output_buffer(dtype="int32"), "not a span of its dtype and length"),
    "before with a mask not of bytes": (output_buffer(), "is not 2 bytes (uint8) for 12 elements"),
    "before in format 4": (lambda p: (output_buffer()(p), edit_manifest(lambda m: m.update(format_version=4))(p))[0],
                           "format version 4 has not"),
    "mask of no output buffer": (edit_call(lambda c: c["tensors"].update({"kept/y": c["tensors"]["in/x"]})),
                                 "is the mask of no output buffer"),
    "argument naming a mask": (output_buffer(argument=True), "names the mask 'kept/out'"),
    "args a dict": (edit_call(lambda c: c.update(args={})), "args"),
    "arg name a list": (edit_call(lambda c: c["args"][0].update(name=["x"])), "name"),
    "arg both tensor and json": (edit_call(lambda c: c["args"][0].update(json=1)), "exactly one"),
    "arg to an undescribed tensor": (edit_call(lambda c: c["args"][0].update(tensor="in/nope")), "undescribed"),
    "arg $float bogus": (edit_call(lambda c: c["args"][3].update(json={"$float": "bogus"})), "wrapper"),
    "arg $tuple not a list": (edit_call(lambda c: c["args"][4].update(json={"$tuple": 5})), "wrapper"),
    "arg $ key beside others": (edit_call(lambda c: c["args"][4].update(json={"$tuple": [], "x": 1})), "only key"),
    "op an int": (edit_call(lambda c: c.update(op=5)), "op"),
    "provider not a module name": (edit_call(lambda c: c.update(provider="os; rm -rf /")), "provider"),
    "metadata number overflowing": (edit_call(lambda c: c.update(meta={"x": "OVERFLOW"})), "overflows"),
    "provider ending in a newline": (edit_call(lambda c: c.update(provider="hostile\n")), "provider"),
    "metadata NaN literal": (raw_call_metadata('{"op": "x", "variant": "y", "args": [], "tensors": {}, "meta": NaN}'),
                             "NaN"),
    "metadata nested deep": (raw_call_metadata('{"op": "x", "meta": ' + nested(100_000) + "}"), "deep"),
    "metadata a list": (raw_call_metadata("[]"), "metadata"),
    "safetensors header nested deep": (raw_safetensors_header(nested(100_000)), "deep"),
    "safetensors header not JSON": (raw_safetensors_header("{not json"), "JSON"),
    "safetensors header without metadata": (raw_safetensors_header('{"in/x": {"dtype": "F32", "shape": [1], '
                                                                   '"data_offsets": [0, 4]}}'), "metadata"),
}
