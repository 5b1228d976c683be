"""Distributed input: datasets, iterators, the batches' placement and their steps.

TF's ``experimental_distribute_dataset`` and ``distribute_datasets_from_function``
(`datasets`), their iterators (`iterators`), the split of a batch over the replicas and its
placement (`place`), the steps of input and the workers' agreement on them (`steps`),
``experimental_make_numpy_dataset`` (`numpy_dataset`), ``TensorSpec`` (`spec`), and the
iterators read inside a ``jd.function`` (`feeds`).

May import: `_base`, `_values`, `_cluster` (workers agree on their input).
"""
