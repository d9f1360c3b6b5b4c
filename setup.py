"""Build dqoes-cg: the Python package and its cffi extension (dqoes_cg._native) from csrc/."""

from setuptools import find_packages, setup

setup(
    name="dqoes-cg",
    version="0.1.0",
    description="Per-host QoE controller for containers on cgroup v2 (DQoES)",
    packages=find_packages(include=["dqoes_cg", "dqoes_cg.*"]),
    python_requires=">=3.11",
    setup_requires=["cffi>=1.15"],
    install_requires=["cffi>=1.15", "numpy>=1.24", "psutil>=5.9", "jeepney>=0.8"],
    extras_require={
        # wheel: the end-to-end tests run `make install` offline (no build isolation)
        "test": ["pytest>=7", "hypothesis>=6", "ruff", "wheel"],
        "bench": ["matplotlib>=3.6"],
        # the multi-node testbed (lab/swarm.py): its nodes' network namespaces and links
        "lab": ["pyroute2>=0.9.1"],
    },
    cffi_modules=["csrc/ffi_build.py:ffibuilder"],
    entry_points={
        "console_scripts": [
            "dqoesd=dqoes_cg.daemon:main",
            "dqoesctl=dqoes_cg.ctl:main",
        ]
    },
)
