"""Build dqoes-cg: the Python package and its cffi extension (dqoes_cg._native) from csrc/."""

import re
from pathlib import Path

from setuptools import find_packages, setup

VERSION = re.search(r'__version__ = "([^"]+)"',
                    Path(__file__).with_name("dqoes_cg").joinpath("__init__.py").read_text())[1]

setup(
    name="dqoes-cg",
    version=VERSION,
    description="Per-host QoE controller for containers on cgroup v2 (DQoES)",
    packages=find_packages(include=["dqoes_cg", "dqoes_cg.*"]),
    python_requires=">=3.11",
    setup_requires=["cffi>=1.15"],
    # prometheus_client: the metrics' exposition (its escaping rules, OpenMetrics), and the
    # parser of the histograms services export (scrape.py)
    install_requires=["cffi>=1.15", "numpy>=1.24", "jeepney>=0.8", "prometheus_client>=0.17"],
    extras_require={
        # wheel: the end-to-end tests run `make install` offline (no build isolation);
        # clang-format: the C style check
        "test": ["pytest>=7", "hypothesis>=6", "ruff", "wheel", "clang-format>=14"],
        # scipy: the cluster oracle's integer programs (bench/cluster/oracle.py, HiGHS)
        "bench": ["matplotlib>=3.6", "psutil>=5.9", "scipy>=1.9"],
        # the lab (lab/): plots, and the multi-node testbed's network namespaces
        "lab": ["matplotlib>=3.6", "pyroute2>=0.7"],
    },
    cffi_modules=["csrc/ffi_build.py:ffibuilder"],
    entry_points={
        "console_scripts": [
            "dqoesd=dqoes_cg.daemon:main",
            "dqoesctl=dqoes_cg.ctl:main",
            "dqoes-manager=dqoes_cg.cluster.managerd:main",
            "dqoes-agent=dqoes_cg.cluster.agent:main",
        ]
    },
)
