"""The state a step reads: TF eager's meaning for what a step reaches besides its arguments.

Where a step (an eager ``strategy.run`` step, or a ``jd.function``) reads arrays and Python
numbers from its closure, globals and object (`capture`, opening each object with `reach`,
through `peek`, which runs no user code, guided by the names the code uses: `names`),
reading it again there on every call (`chains`, which also names a place as Python reads
it), what a trace reads as it runs (`record`, over `frames`: the frames it enters), the
Python values its trace depends on (`watch`; words for its checks: `checks`), when
two functions are the same step and whether a watched one still is (`keys`), the values in
library objects that a write barrier guards (`typed`: a Keras layer's), its numbers as
program inputs (`promote`), writing at those places and what a trace assigned (`assign`), a
step traced once with that state as inputs (`stage`; what its trace says of the state it
read: `reads`; each call of it: `calls`), and the state a user's own ``jax.jit`` froze,
named (`frozen`). A replica step's state has TF's variables' meaning (`replica`: distributed
values read per replica, assignments written back as one value or a `PerReplica`, which
values differ read off its jaxpr by `varying`).

May import: `_base`, `_values`.
"""
