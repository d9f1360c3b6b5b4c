"""Real-kernel test harness: a throwaway qemu guest with cgroup v2 (see README.md)."""
