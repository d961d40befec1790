"""`python -m bench`: see bench/suite.py, or run it with --help."""

from bench.suite import main

main()
