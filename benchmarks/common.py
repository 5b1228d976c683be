"""Shared set-up and timing for the benchmarks (8 simulated CPU devices)."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import collections  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402


def per_call(fn, n, repeats=5, warmup=2, block_every=4, lag=0):
    """Median seconds per call of ``fn()`` over ``repeats`` runs of ``n`` calls.

    ``fn`` returns something to block on, so that un-blocked collectives never
    pile up (see docs/guides/guarantees.md, "Programs in flight"): every ``block_every`` calls the latest result is waited
    for, or, with ``lag``, the result of the call ``lag`` calls back (the policy
    of `strategy.run`'s in-flight cap, which keeps the pipeline full).
    """
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out, pending = None, collections.deque()
        for i in range(n):
            out = fn()
            if lag:
                pending.append(out)
                if len(pending) > lag:
                    jax.block_until_ready(pending.popleft())
            elif block_every and (i + 1) % block_every == 0:
                jax.block_until_ready(out)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times)


def paired(ours, reference, n, rounds=9, lag=4):
    """Interleaved rounds of both loops (same blocking policy): median seconds per call of
    each, and the median and range of the per-round ratios (ours / reference)."""
    t_ours, t_ref, ratios = [], [], []
    for i in range(rounds):
        order = [(ours, t_ours), (reference, t_ref)]
        for fn, out in order if i % 2 else order[::-1]:  # alternate who goes first
            out.append(per_call(fn, n, repeats=1, lag=lag))
        ratios.append(t_ours[-1] / t_ref[-1])
    return {
        "ours_s": statistics.median(t_ours),
        "reference_s": statistics.median(t_ref),
        "ratio": statistics.median(ratios),
        "ratio_range": (min(ratios), max(ratios)),
    }


def paired_row(name, r):
    """A `paired` result as (a results.json entry, a table row: µs, µs, ratio (range))."""
    a, b, lo, hi = r["ours_s"], r["reference_s"], *r["ratio_range"]
    entry = {"jaxdist_us": a * 1e6, "reference_us": b * 1e6, "ratio": r["ratio"]}
    return entry, [
        name,
        f"{a * 1e6:.0f}",
        f"{b * 1e6:.0f}",
        f"{r['ratio']:.2f} ({lo:.2f}-{hi:.2f})",
    ]


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_bytes(n):
    return f"{n // (1 << 20)} MiB" if n >= 1 << 20 else f"{n // 1024} KiB"
