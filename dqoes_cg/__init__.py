"""dqoes-cg: a per-host QoE controller for containers on cgroup v2 (DQoES)."""

__version__ = "0.2.0"
