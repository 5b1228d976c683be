"""How long every worker takes to end after a fault, two workers on this machine.

python -m benchmarks.bench_faults [TIMEOUT_SECONDS]     # default 10

Runs `tests/multiworker_worker.py`'s ``uneven_fault`` scenario (worker 1's dataset has one
batch less; on that step one worker raises, calls ``sys.exit``, is killed or stops calling
for three timeouts) for each of the 8 outcomes, with
``CommunicationOptions(timeout_seconds=TIMEOUT_SECONDS)``, and prints, per worker, the seconds
from the fault (the worker prints its time) to the end of its process, its exit status and
its last line. The bound jaxdist keeps: every worker ends within ``timeout_seconds`` + 5 s.
"""

import os
import sys

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "cluster")
)

import test_multi_worker as harness  # noqa: E402


def _last_line(text):
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else ""


def outcome(fault, timeout):
    """{task: (seconds from the fault to its end, exit status, last line)} of one run."""
    outs, took = harness.run_fault(fault, timeout)
    return {t: (took[t], rc, _last_line(stderr)) for t, (rc, stderr) in outs.items()}


def main(timeout=10.0):
    rows = [
        "| fault (kind:worker) | worker 0 ends after (s), status | worker 1 | bound |",
        "|---|---|---|---|",
    ]
    for fault in harness.UNEVEN_FAULTS:
        got = outcome(fault, timeout)
        cells = [f"{s:.1f}, {rc}" for s, rc, _ in got.values()]
        ok = all(s < timeout + 5 for s, _, _ in got.values())
        rows.append(f"| {fault} | {' | '.join(cells)} | {'met' if ok else 'NOT met'} |")
        for t, (s, rc, last) in got.items():
            print(f"{fault} worker:{t[1]} {s:.1f}s rc={rc}: {last[:160]}", file=sys.stderr)
    print(f"timeout_seconds={timeout:g}\n\n" + "\n".join(rows))


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 10.0)
