"""`python -m replay`: the command line (bisect probes run the engine this way)."""
from replay.cli import main

main()
