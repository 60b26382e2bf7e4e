"""Recording and replaying Triton launches of code that never heard of kernel-replay.

    door.py       Triton's own launch method replaced while a recording is active (JIT and interpreter)
    recording.py  a launch the door hands over, filtered and recorded as a call
    kernels.py    what a kernel is: its module, name, parameters, constexprs and source
    writes.py     which pointer parameters a kernel writes through, read from its source
    relaunch.py   a recorded launch as an op: the kernel found in trusted code and launched again
    launch_record.py  a recorded launch as a launch record: what `replay ptx` compiles and `replay trace` shows
"""
