"""Recording calls into snapshots: the capture package, one job a module.

    staging.py         one walk over a call: its arguments, outputs and tags, each tensor to a Stage
    intercept.py       what a recorded function does when called: run, verify, or record (one flag)
    session.py         a recording: each call's tensors copied as it runs, handed to the writers
    graph_recording.py a recording's path for calls inside CUDA graphs (staged, written per replay)
    graphs.py          staging inside CUDA graphs: tapes, slabs, put-off copies
    pipeline.py        host copies to files, on writer threads; the flight recorder's ring
    options.py         RecordingOptions: what a recording is asked to do
    lifecycle.py       start, stop, route, flush, dump, recording(); CUDA graph hooks; signals; REPLAY_CAPTURE

The call context every tool shares (tags, scopes, launch records) is replay/context.py: replaying,
`replay ptx`, `replay invariance` and the verifier use it without this package.
"""
from typing import Any

from replay.recorder import graphs
from replay.recorder.lifecycle import (active, before_graph_capture, dump, flush, recording, set_verifier, start,
                                      start_from_env, stop)
from replay.recorder.options import RecordingOptions
from replay.recorder.session import Recording

__all__ = ["Recording", "RecordingOptions", "active", "before_graph_capture", "dump", "flush", "recapture_needed",
           "recording", "set_verifier", "start", "start_from_env", "stop"]


def recapture_needed(graph: Any) -> bool:
    """Whether a CUDA graph should be captured again for the recording state it meets now: a
    recording is active that did not see the graph captured (its replays would go unrecorded), or
    the one that saw it has ended (its staging copies now cost for nothing). A model that replays
    graphs asks this before each replay and captures again when it says so."""
    return (active() is None) != (graphs.tape_of(graph) is None)
