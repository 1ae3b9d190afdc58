"""The benchmarks run by scripts/bench (not part of the installed package); see bench.py."""
