"""Overhead microbenchmarks of dqoes-cg against the baselines: `python3 -m bench` (README.md)."""
