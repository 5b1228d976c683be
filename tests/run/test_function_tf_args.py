"""`jd.function` with TF's ``tf.function`` arguments: ``input_signature``, the options,
``get_concrete_function`` and ``experimental_get_tracing_count``.

TF 2.21's answers (tensorflow-cpu, eager) that these tests hold jaxdist to:

* ``input_signature=[TensorSpec((None, 2), float32)]``: ``f(ones((3, 2)))`` and
  ``f(ones((5, 2)))`` run on one trace (count 1); a (3, 3), a (3,) or a float64 tensor is
  ``TypeError: Binding inputs to tf.function failed due to `Can not cast TensorSpec(shape=(3, 3),
  ...) to TensorSpec(shape=(None, 2), ...)`...``; NumPy float64 / int64 arrays and Python lists are
  converted to float32; ``f(x=...)`` binds by name; a second positional argument is ``too many
  positional arguments``, none is ``missing a required argument: 'x'``, ``y=1`` is ``got an
  unexpected keyword argument 'y'``.
* int32 spec: a Python 1.5 or 3.0 is ``TypeError ... Cannot convert 3.0 to EagerTensor of dtype
  int32``; a Python int, a bool, np.int64 and np.float32 convert. float32 spec: a bool and an int
  convert, an int32 tensor does not, ``1j`` and ``"a"`` do not.
* the signature itself: a bare TensorSpec is ``TypeError: input_signature must be either a tuple or
  a list``; ``[3]`` / ``[None]`` is ``must be a possibly nested sequence of TensorSpec``; one spec
  too many is ``contains 1 extra type constraints``; ``lambda x, y`` with one spec is ``missing
  type constraint for y``; a keyword-only parameter without default is an error; a parameter
  past the specs keeps its default only (``Can not cast 3 to Literal[2]``); ``*args`` takes the
  specs as ``args_0, args_1`` (one given: ``missing a required argument: 'args_1'``);
  ``**kwargs`` takes nothing.
* a method: ``self`` takes no spec; two shapes on a (None,) spec: count 1.
  ``get_concrete_function()`` of it: ``structured_input_signature`` is
  ``((TensorSpec(shape=(None,), dtype=float32, name='x'),), {})``; a call of it with a
  matching tensor, a NumPy array or by keyword runs; count stays 1.
* ``get_concrete_function(TensorSpec((None,)), 2.0)`` of ``lambda x, y``: signature
  ``((TensorSpec(..., name='x'), 2.0), {})``, count 1, a call with 3.0 is ``Can not cast 3.0 to
  Literal[2.0]``; ``structured_outputs`` of ``lambda x: {"a": x, "b": (x, 2)}`` for (2,) is
  ``{'a': <shape (2,) float32>, 'b': (<shape (2,) float32>, <shape () int32>)}`` (TF's 2 is a
  tensor; jaxdist's stays the Python 2).
* no signature: four shapes trace four times; with ``reduce_retracing=True`` (or
  ``experimental_relax_shapes=True``) TF traces twice (jaxdist: four, shapes are static).
* every option accepted (``jit_compile=False``, ``autograph=False``, ``experimental_compile``,
  ``experimental_implements="name"``, ...).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdist as jd

S = jd.TensorSpec
REPLICAS = [1, 2, 8]


def _strategy(n):
    return jd.MirroredStrategy([f"/cpu:{i}" for i in range(n)])


def _binding_error(match):
    return pytest.raises(TypeError, match=r"Binding inputs to jd.function .*" + match)


# -- plain functions ------------------------------------------------------------------------------


def test_signature_with_none_dims_checks_every_call_before_work():
    ran = []

    @jd.function(input_signature=[S((None, 2), "float32")])
    def f(x):
        ran.append(1)
        return x.sum()

    assert float(f(jnp.ones((3, 2)))) == 6.0
    assert float(f(jnp.ones((5, 2)))) == 10.0  # any size in the None dimension
    assert float(f(np.ones((3, 2)))) == 6.0  # NumPy float64: converted (TF)
    assert float(f(np.ones((3, 2), np.int64))) == 6.0
    assert float(f([[1.0, 2.0]])) == 3.0  # a list: converted
    assert float(f(x=jnp.ones((3, 2)))) == 6.0  # by name
    # one trace per concrete shape: (3, 2), (5, 2), (1, 2) (TF: one, with an unknown dim)
    assert f.experimental_get_tracing_count() == 3
    traced = len(ran)
    bad = [
        (jnp.ones((3, 3)), r"TensorSpec\(shape=\(3, 3\), dtype=float32\)"),
        (jnp.ones((3,)), r"TensorSpec\(shape=\(3,\), dtype=float32\)"),
        (jnp.ones((3, 2), jnp.int32), r"TensorSpec\(shape=\(3, 2\), dtype=int32\)"),
        (1.5, r"TensorSpec\(shape=\(\), dtype=float64\)"),
    ]
    for value, got in bad:
        with _binding_error(
            rf"argument `x`: Can not cast {got}.* to TensorSpec\(shape=\(None, 2\)"
        ):
            f(value)
    with _binding_error("too many positional arguments"):
        f(jnp.ones((3, 2)), 1)
    with _binding_error("missing a required argument: 'x'"):
        f()
    with _binding_error("got an unexpected keyword argument 'y'"):
        f(jnp.ones((3, 2)), y=1)
    assert len(ran) == traced  # nothing traced for a call that does not fit
    assert f.experimental_get_tracing_count() == 3
    assert f.input_signature == (S((None, 2), "float32"),)


@pytest.mark.parametrize(
    "dtype, value, fits",
    [
        ("int32", 1.5, False),
        ("int32", 3.0, False),  # TF: Cannot convert 3.0 to EagerTensor of dtype int32
        ("int32", 3, True),
        ("int32", True, True),
        ("int32", np.int64(3), True),
        ("int32", np.float32(3), True),  # a NumPy value casts
        ("float32", True, True),
        ("float32", 3, True),
        ("float32", np.array(3), True),
        ("float32", 1j, False),
        ("float32", "a", False),
        ("float32", jnp.asarray(3, jnp.int32), False),  # a tensor is not cast
    ],
)
def test_conversions_are_tfs(dtype, value, fits):
    f = jd.function(lambda x: x + 1, input_signature=[S((), dtype)])
    if fits:
        out = f(value)
        assert out.dtype == np.dtype(dtype) and int(out) == int(np.asarray(value).real) + 1
    else:
        with _binding_error("Can not cast"):
            f(value)


def test_python_numbers_under_a_signature_share_one_trace():
    f = jd.function(lambda x: x * 2, input_signature=[S((), "float32")])
    assert [float(f(v)) for v in (1.0, 2.0, 3, jnp.asarray(4.0))] == [2.0, 4.0, 6.0, 8.0]
    assert f.experimental_get_tracing_count() == 1  # a weak-typed array too


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: jd.function(lambda x: x, input_signature=S(())), "must be a list or tuple"),
        (lambda: jd.function(lambda x: x, input_signature=[3]), "nested list or tuple"),
        (lambda: jd.function(lambda x: x, input_signature=[None]), "nested list or tuple"),
        (lambda: jd.function(lambda x: x, input_signature=[S(()), S(())]), "1 extra type"),
        (lambda: jd.function(lambda x, y: x, input_signature=[S(())]), "constraint for y"),
        (lambda: jd.function(lambda x, *, y: x, input_signature=[S(())]), "`y` must have a"),
    ],
)
def test_bad_signatures_are_type_errors_at_decoration(make, match):
    with pytest.raises(TypeError, match=match):
        make()


def test_parameters_past_the_signature_varargs_and_kwargs_follow_tf():
    def scaled(x, y=2, *, z=1):
        return x * y * z

    f = jd.function(scaled, input_signature=[S(())])
    assert float(f(1.0)) == 2.0 and float(f(1.0, 2, z=1)) == 2.0
    with _binding_error(r"Can not cast 3 to Literal\[2\]"):
        f(1.0, 3)
    with _binding_error(r"Can not cast 5 to Literal\[1\]"):
        f(1.0, z=5)

    g = jd.function(lambda *args: args[0] + args[1], input_signature=[S(()), S(())])
    assert float(g(1.0, 2.0)) == 3.0
    with _binding_error("missing a required argument: 'args_1'"):
        g(1.0)

    h = jd.function(lambda x, **kw: x, input_signature=[S(())])
    assert float(h(1.0)) == 1.0
    with _binding_error("unexpected keyword argument 'a'"):
        h(1.0, a=2)


def test_nested_signatures():
    f = jd.function(lambda d: d["a"] + d["b"], input_signature=[{"a": S(()), "b": S((None,))}])
    assert list(f({"a": 1.0, "b": [1.0, 2.0]})) == [2.0, 3.0]
    with _binding_error("does not have the structure"):
        f({"a": 1.0})
    g = jd.function(lambda p: p[0] + p[1], input_signature=[[S(()), S(())]])
    assert float(g([1.0, 2.0])) == 3.0
    with _binding_error("does not have the structure"):
        g((1.0, 2.0))  # TF: Can not cast (1.0, 2.0) to list type


# -- methods and strategy.run ---------------------------------------------------------------------


class Trainer:
    def __init__(self, strategy):
        self.strategy = strategy
        self.w = jnp.ones(())
        self.calls = 0

    def replica_step(self, x):
        return jd.get_replica_context().all_reduce("SUM", x.sum() * self.w)

    @jd.function(input_signature=[S((None,), "float32")])
    def train(self, x):
        total = self.strategy.run(self.replica_step, args=(x,))
        self.w = self.w + 1.0
        self.calls += 1
        return self.strategy.reduce("MEAN", total, axis=None)

    @jd.function(input_signature=[S((None,), "float32")])
    def local(self, x):
        return x.sum() * self.w


@pytest.mark.parametrize("n", REPLICAS)
def test_method_with_strategy_run_inside(n):
    t = Trainer(_strategy(n))
    # every replica sums its own x (the same array on every replica), times w: SUM over n
    assert float(t.train(jnp.ones(4))) == 4.0 * n
    assert float(t.train(jnp.ones(4))) == 8.0 * n  # w is 2 now
    assert float(t.train(jnp.ones(6))) == 18.0 * n  # another size: one more trace
    assert float(t.w) == 4.0 and t.calls == 3
    assert t.train.experimental_get_tracing_count() == 2
    with _binding_error(r"Can not cast TensorSpec\(shape=\(4, 2\)"):
        t.train(jnp.ones((4, 2)))
    assert float(t.w) == 4.0 and t.calls == 3  # refused before any work
    assert Trainer.train.input_signature == (S((None,), "float32"),)
    assert float(Trainer.train(t, x=jnp.ones(2))) == 8.0 * n  # unbound: self takes no spec


@pytest.mark.parametrize("n", REPLICAS)
def test_function_called_inside_strategy_run_checks_its_signature(n):
    strategy = _strategy(n)
    t = Trainer(strategy)
    per_replica = strategy.run(lambda: t.local(jnp.ones(3)))
    assert [float(v) for v in strategy.experimental_local_results(per_replica)] == [3.0] * n
    with pytest.raises(TypeError, match="Can not cast"):
        strategy.run(lambda: t.local(jnp.ones((3, 1))))


@pytest.mark.parametrize("n", REPLICAS)
def test_distributed_batches_fit_the_datasets_element_spec(n):
    strategy = _strategy(n)
    data = np.arange(4 * n * 3, dtype=np.float32).reshape(4 * n, 3)
    dist = strategy.experimental_distribute_dataset([data[: 2 * n], data[2 * n :]])
    spec = dist.element_spec
    assert spec == S((None, 3), "float32")

    @jd.function(input_signature=[spec])
    def step(batch):
        sums = strategy.run(lambda x: x.sum(), args=(batch,))
        return strategy.reduce("SUM", sums, axis=None)

    totals = [float(step(batch)) for batch in dist]
    assert totals == [float(data[: 2 * n].sum()), float(data[2 * n :].sum())]
    assert step.experimental_get_tracing_count() == 1
    wrong = strategy.experimental_distribute_values_from_function(lambda ctx: jnp.ones((2, 4)))
    with _binding_error("Can not cast"):
        step(wrong)


# -- get_concrete_function ------------------------------------------------------------------------


@pytest.mark.parametrize("n", REPLICAS)
def test_concrete_function_of_a_method(n):
    t = Trainer(_strategy(n))
    cf = t.train.get_concrete_function()
    assert cf.structured_input_signature == ((S((None,), "float32", "x"),), {})
    assert t.train.experimental_get_tracing_count() == 0  # a None dimension: traced at calls
    with pytest.raises(ValueError, match="unknown dimensions"):
        _ = cf.structured_outputs
    assert float(cf(jnp.ones(3))) == 3.0 * n
    assert float(cf(x=np.ones(3, np.float32))) == 6.0 * n
    with _binding_error("Can not cast"):
        cf(jnp.ones((3, 1)))  # (TF's concrete function does not check this one)
    assert t.train.experimental_get_tracing_count() == 1

    full = t.train.get_concrete_function(S((5,), "float32"))
    assert t.train.experimental_get_tracing_count() == 2  # traced now, not run
    assert float(t.w) == 3.0 and t.calls == 2
    assert full.structured_outputs == S((), "float32")
    assert float(t.train(jnp.ones(5))) == 15.0 * n
    assert t.train.experimental_get_tracing_count() == 2  # the call used that trace
    with _binding_error("Can not cast"):
        t.train.get_concrete_function(S((5,), "int32"))


def test_concrete_function_without_a_signature():
    f = jd.function(lambda x, y: x * y)
    cf = f.get_concrete_function(S((3,), "float32"), 2.0)
    assert cf.structured_input_signature == ((S((3,), "float32", "x"), 2.0), {})
    assert cf.structured_outputs == S((3,), "float32")
    assert f.experimental_get_tracing_count() == 1
    assert list(cf(jnp.ones(3), 2.0)) == [2.0, 2.0, 2.0]
    assert f.experimental_get_tracing_count() == 1
    with _binding_error(r"Can not cast 3.0 to Literal\[2.0\]"):
        cf(jnp.ones(3), 3.0)
    g = jd.function(lambda x: {"a": x, "b": (x, 2)})
    outs = g.get_concrete_function(jnp.ones(2)).structured_outputs
    assert outs == {"a": S((2,), "float32"), "b": (S((2,), "float32"), 2)}


@pytest.mark.parametrize("n", [2, 8])
def test_concrete_function_outputs_of_distributed_values(n):
    strategy = _strategy(n)
    f = jd.function(lambda x: strategy.run(lambda v: v * 2, args=(x,)))
    outs = f.get_concrete_function(S((4,), "float32")).structured_outputs
    assert outs == (S((4,), "float32"),) * n


# -- options --------------------------------------------------------------------------------------


OPTIONS = [
    {"jit_compile": True},
    {"jit_compile": False},
    {"autograph": False},
    {"reduce_retracing": True},
    {"experimental_relax_shapes": True},
    {"experimental_compile": True},
    {"experimental_follow_type_hints": True},
    {"experimental_implements": "embedding_matmul"},
    {"experimental_attributes": {"_noinline": True}},
    {"experimental_autograph_options": ("ALL",)},
]


@pytest.mark.parametrize("options", OPTIONS)
def test_tf_options_are_accepted_and_shapes_still_trace_each(options):
    def total(x):
        return x.sum()

    f = jd.function(total, **options)
    base = 10 * OPTIONS.index(options)  # (shapes of its own: one code shares its traces)
    sizes = [base + k for k in (2, 3, 4, 5)]
    assert [float(f(jnp.ones(k))) for k in sizes] == [float(k) for k in sizes]
    assert f.experimental_get_tracing_count() == 4  # (TF with reduce_retracing: 2)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"autograph": "yes"}, "autograph"),
        ({"reduce_retracing": None}, "reduce_retracing"),
        ({"jit_compile": "x"}, "jit_compile"),
        ({"experimental_implements": 3}, "experimental_implements"),
        ({"experimental_attributes": 3}, "experimental_attributes"),
        ({"experimental_relax_shapes": "x"}, "experimental_relax_shapes"),
    ],
)
def test_options_of_the_wrong_type_are_named(options, match):
    with pytest.raises(TypeError, match=match):
        jd.function(lambda x: x, **options)


def test_tfs_positional_and_keyword_forms():
    f = jd.function(lambda x: x + 1, [S((), "float32")])  # tf.function(f, [spec])
    assert float(f(1.0)) == 2.0 and f.input_signature == (S((), "float32"),)
    g = jd.function(func=lambda x: x + 1)
    assert float(g(jnp.ones(()))) == 2.0
    with pytest.raises(TypeError, match="func"):
        jd.function(3)


def test_inside_another_trace_the_signature_still_binds():
    f = jd.function(lambda x: x * 2, input_signature=[S((None,), "float32")])
    assert list(jax.jit(f)(jnp.ones(2))) == [2.0, 2.0]
    with pytest.raises(TypeError, match="Can not cast"):
        jax.jit(f)(jnp.ones((2, 2)))
