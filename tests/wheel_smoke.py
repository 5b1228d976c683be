"""Smoke test of an installed jaxdist wheel (run by `make wheel-smoke` in a fresh venv).

Imports every public module, runs a 2-replica step on 2 simulated CPU devices and reduces it:
a missing module, package-data file or import-time dependency fails here, not on a user's machine.
Expected values come from the replica count alone.
"""

import importlib.metadata
import pathlib
import sys

import jax
import numpy as np

import jaxdist as jd
import jaxdist.cluster_resolver
import jaxdist.errors
import jaxdist.experimental
import jaxdist.nn

here = pathlib.Path(jd.__file__).resolve()
assert "site-packages" in here.parts, f"jaxdist imported from {here}, not from the installed wheel"
assert (here.parent / "py.typed").exists(), "py.typed missing from the wheel"
assert jd.__version__ == importlib.metadata.version("jaxdist"), (
    jd.__version__,
    importlib.metadata.version("jaxdist"),
)
assert len(jax.devices()) == 2, jax.devices()

strategy = jd.MirroredStrategy()
assert strategy.num_replicas_in_sync == 2


def step(x):
    ctx = jd.get_replica_context()
    return ctx.all_reduce(jd.ReduceOp.SUM, x) + ctx.replica_id_in_sync_group


(batch,) = strategy.experimental_distribute_dataset([np.arange(4.0, dtype=np.float32)])
out = strategy.run(step, args=(batch,))
# Replica 0 holds [0, 1], replica 1 holds [2, 3]: the all-reduce is [2, 4] on both, plus the id.
local = [np.asarray(v) for v in strategy.experimental_local_results(out)]
np.testing.assert_allclose(local[0], [2.0, 4.0])
np.testing.assert_allclose(local[1], [3.0, 5.0])
total = strategy.reduce(jd.ReduceOp.SUM, out, axis=None)
np.testing.assert_allclose(np.asarray(total), [5.0, 9.0])
mean = strategy.reduce("MEAN", out, axis=0)  # over the 4 rows: (2 + 4 + 3 + 5) / 4
np.testing.assert_allclose(float(mean), 3.5)
print(
    f"wheel smoke OK: jaxdist {jd.__version__} from {here.parent}, python {sys.version.split()[0]}"
)
