"""Keras 3 (JAX backend) under a strategy: loaded only when Keras is in use.

The scope's distribution hook and the patched ``keras.Model`` factories (`distribution`),
the data-parallel step functions (`steps`), one replica's step with TF's rules for combining
replicas (`replica`), a model's own ``train_step``/``test_step``/``predict_step`` run per
replica (`override`) with what Keras' TF backend means by its losses and optimizers there
(`tfloss`), synchronized batch norm (`syncbn`), ``steps_per_execution`` batches as one
program (`fused`), and the batches Keras' epoch iterator hands the step (`batches`). The
only modules that import Keras.

May import: `_base`, `_values`, `_input` (Keras' batches are distributed input), `_state`
(jaxdist's own Keras step takes its state as arguments: `explicit_state`) and `_strategy`.
"""
