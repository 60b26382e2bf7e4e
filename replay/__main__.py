"""`python -m replay`: the command line (bisect probes run the engine this way).

`python -m` puts the working directory first on sys.path; a provider a snapshot names must
not be found there (a `kernels/` in a downloaded directory), so it is taken off.
"""
import os
import sys

if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from replay.cli import main  # noqa: E402

main()
