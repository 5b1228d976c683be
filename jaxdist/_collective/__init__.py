"""Collectives: TF's cross-device ops, ``ReplicaContext`` and the cross-replica reduce.

The cross-device ops and the one home of TF's reduce rules (`cross_device_ops`), the all-reduce
implementations (`all_reduce`: ``NcclAllReduce``, ``HierarchicalCopyAllReduce``), the replica
context over a record of collective functions per execution path (`replica_context`), and
``Strategy.reduce`` / ``gather`` / local results (`reduce`).

May import: `_base`, `_values`, `_program` (a reduce outside a step is a program too).
"""
