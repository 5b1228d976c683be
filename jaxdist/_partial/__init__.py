"""Partial batches: a step on replicas whose batches differ in size.

The replicas of one shape traced once each (`ragged`), their jaxprs run in lockstep with
every collective between them (`lockstep`), their host callbacks once per replica
(`callbacks`), the step's trace per group of replicas (`replay`) and ``merge_call`` there
(`merge`).

May import: `_base`, `_values`, `_state` (a partial-batch step reads its state too),
`_program`, `_collective`.
"""
