"""Running a step: ``Strategy.run`` and ``jd.function`` (TF's ``tf.function``).

``Strategy.run``, eager and traced, one replica or many, full and partial batches (`run`), and
``jd.function``: the whole function one program, its state read as inputs and what it assigns
written back, iterators read inside it (`function`), its ``input_signature`` and TF options
(`signature`), ``get_concrete_function`` (`concrete`).

May import: `_base`, `_values`, `_state`, `_program`, `_collective`, `_partial`, `_input`.
"""
