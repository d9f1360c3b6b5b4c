"""The lab around dqoes-cg: the demo, the testbed and its workloads, the fake cgroup tree,
and the qemu guest that gives a real cgroup v2 kernel. Tests, benchmarks and the demo use it;
the product package (dqoes_cg) never does."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
"""The checkout: the working directory of the processes the lab starts (`python -m lab...`)."""
