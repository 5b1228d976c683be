"""The strategies: TF's ``Strategy`` classes, their ``extended`` and the default strategy.

The TF2 ``Strategy`` (`strategy`), ``StrategyExtended`` (`extended`), the base class of
``StrategyV1`` with the other TF1 methods (`compat`: renamed methods, session config and cluster)
and its TF1 input methods (`tf1_input`: ``experimental_run``, ``make_dataset_iterator``, the TF1
dataset helpers, ``deprecated``), logical devices (`logical_devices`), the concrete strategies
(`mirrored`, `multi_worker`), the default strategy and the public getters (`default`), and
``jd.nn`` (`nn`).

May import: `_base`, `_values`, `_program`, `_collective`, `_run`, `_input`, `_cluster`.
"""
