"""python3 -m bench.probe: what the pure-Python producer (dqoes-probe, probe/) costs against
dqoes-cg's cffi producer (dqoes_cg.probe).

    python3 -m bench.probe [--runs N]

- install size: its wheel, and what `pip install --target` puts on disk (no dependency);
- import time: the median of N fresh interpreters that import it, less one that imports
  nothing (`python3 -S`, so that site's own imports are no part of either);
- a record's cost: the median over N runs of 100,000 `record_ns` calls into a ring on tmpfs
  (the clock read, the claim, the slot), each producer in turn.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = 100_000
TMPFS = Path("/dev/shm")


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _install(tmp: Path) -> tuple[int, int, Path]:
    """The wheel's size, the installed files' size, and where they are."""
    wheels, target = tmp / "wheel", tmp / "site"
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(ROOT / "probe")], check=True, capture_output=True)
    [wheel] = wheels.glob("dqoes_probe-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(target),
                    str(wheel)], check=True, capture_output=True)
    return wheel.stat().st_size, _size(target), target


def _start_ms(code: str, path: Path, runs: int) -> float:
    """The median wall time of a fresh `python3 -S -c code` with `path` on sys.path."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path[:0] = "
                        f"[{str(path)!r}, {str(ROOT)!r}]; {code}"], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _record_ns(probe: object, runs: int) -> float:
    """The median cost of one record_ns call, in ns."""
    record = probe.record_ns  # type: ignore[attr-defined]
    costs = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        for _ in range(RECORDS):
            record(1000)
        costs.append((time.perf_counter_ns() - start) / RECORDS)
    return statistics.median(costs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wheel, installed, site = _install(Path(tmp))
        print(f"dqoes-probe: wheel {wheel / 1024:.1f} KiB, installed {installed / 1024:.1f} KiB, "
              "no dependency")
        bare = _start_ms("pass", site, args.runs)
        pure = _start_ms("import dqoes_probe", site, args.runs)
        cffi = _start_ms("import dqoes_cg.probe", site, args.runs)
        print(f"import, median of {args.runs} fresh interpreters less a bare one "
              f"({bare:.1f} ms): dqoes_probe {pure - bare:.1f} ms, "
              f"dqoes_cg.probe (cffi) {cffi - bare:.1f} ms")

        sys.path.insert(0, str(site))
        import dqoes_probe

        from dqoes_cg.probe import Probe as CffiProbe
        from dqoes_cg.ring import create_ring

        directory = TMPFS if TMPFS.is_dir() else Path(tmp)
        with tempfile.TemporaryDirectory(dir=directory) as rings:
            ring = Path(rings) / "ring"
            create_ring(ring, 1 << 16)
            with dqoes_probe.Probe.open(ring) as pure_probe, CffiProbe.open(ring) as cffi_probe:
                assert pure_probe.attached and cffi_probe.attached
                pure_ns = _record_ns(pure_probe, args.runs)
                cffi_ns = _record_ns(cffi_probe, args.runs)
        print(f"a record (record_ns), median of {args.runs} runs of {RECORDS:,}: "
              f"dqoes_probe {pure_ns:.0f} ns, dqoes_cg.probe (cffi) {cffi_ns:.0f} ns, "
              f"ratio {pure_ns / cffi_ns:.1f}")


if __name__ == "__main__":
    main()
