"""JAX beyond its public API is read in one module, checked on this JAX; jaxdist's own
`TensorSpec` is the element spec on every JAX version."""

import pathlib
import pickle
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdist as jd
from jaxdist._base.jax_internals import (
    COLLECTIVE_PARAMS,
    JaxInternalsError,
    backends_started,
    check_collectives,
    coordination_client,
    private_attr,
    trace_state_clean,
)

ROOT = pathlib.Path(__file__).resolve().parents[2] / "jaxdist"


def test_only_the_door_module_reads_private_jax():
    readers = sorted(
        p.name
        for p in ROOT.rglob("*.py")
        if re.search(r"jax\._src|from jax import _src", p.read_text())
    )
    assert readers == ["jax_internals.py"]


def test_this_jax_has_what_jaxdist_reads():
    check_collectives(jd.AXIS)
    assert trace_state_clean() is True
    assert jax.jit(lambda x: x + trace_state_clean())(1) == 1  # tracing: False
    assert backends_started() is True  # conftest's JAX has started
    assert coordination_client() is None  # no jax.distributed in this process


def test_a_missing_private_name_names_the_jax_version():
    with pytest.raises(JaxInternalsError) as e:
        private_attr("jax._src.core", "no_such_name_in_jax")
    assert f"JAX {jax.__version__}" in str(e.value)
    assert "jax._src.core.no_such_name_in_jax" in str(e.value)


def test_collectives_that_trace_otherwise_are_an_error_not_a_wrong_answer(monkeypatch):
    monkeypatch.setitem(COLLECTIVE_PARAMS, "psum", ("axes", "a_param_jax_lacks"))
    with pytest.raises(JaxInternalsError, match="a_param_jax_lacks.*'psum'"):
        check_collectives.__wrapped__("other_axis")
    monkeypatch.setitem(COLLECTIVE_PARAMS, "psum", ("axes",))
    monkeypatch.setitem(COLLECTIVE_PARAMS, "psum_v9", ())
    with pytest.raises(JaxInternalsError, match="primitive 'psum_v9'"):
        check_collectives.__wrapped__("other_axis")


# -- TensorSpec ---------------------------------------------------------------------------------


def test_tensor_spec_is_tfs():
    spec = jd.TensorSpec((None, 3), jnp.float32, name="x")
    assert repr(spec) == "TensorSpec(shape=(None, 3), dtype=float32, name='x')"
    assert (spec.shape, spec.dtype, spec.name, spec.ndim) == ((None, 3), np.float32, "x", 2)
    assert not spec.is_fully_defined() and jd.TensorSpec((2, 3)).is_fully_defined()
    assert spec == jd.TensorSpec([None, 3], "float32", "x") != jd.TensorSpec((None, 3), "float32")
    assert len({spec, jd.TensorSpec((None, 3), np.float32, "x")}) == 1
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert jd.TensorSpec(4).shape == (4,) and jd.TensorSpec(()).shape == ()
    assert jd.TensorSpec((2,)).dtype == np.float32  # TF's default dtype
    assert jax.tree.leaves({"a": spec}) == [spec]  # a pytree leaf


@pytest.mark.parametrize(
    "other, expected",
    [
        (jd.TensorSpec((8, 3), "float32"), True),
        (jd.TensorSpec((None, 3), "float32"), True),
        (jd.TensorSpec((None, None), "float32"), True),
        (jd.TensorSpec((8, 4), "float32"), False),
        (jd.TensorSpec((8, 3), "int32"), False),
        (jd.TensorSpec((8, 3, 1), "float32"), False),
        (np.zeros((5, 3), np.float32), True),
        (jnp.zeros((0, 3), jnp.float32), True),
        (np.zeros((5, 3), np.float64), False),
        ("not an array", False),
    ],
)
def test_is_compatible_with(other, expected):
    assert jd.TensorSpec((None, 3), "float32").is_compatible_with(other) is expected


@pytest.mark.parametrize(
    "args, error, words",
    [
        ((None,), TypeError, "shape must be a sequence"),
        (("abc",), TypeError, "shape must be a sequence"),
        (((2, 1.5),), TypeError, "must be an int or None; got 1.5"),
        (((2, True),), TypeError, "must be an int or None; got True"),
        (((2, -1),), ValueError, ">= 0 or None; got -1"),
        (((2,), "no_such_dtype"), TypeError, "dtype must be"),
        (((2,), "float32", 3), TypeError, "name must be a str or None; got int"),
    ],
)
def test_bad_tensor_specs_are_named(args, error, words):
    with pytest.raises(error, match=re.escape(words)):
        jd.TensorSpec(*args)


def test_from_tensor_and_from_spec():
    assert jd.TensorSpec.from_tensor(np.zeros((2, 5), np.int32)) == jd.TensorSpec((2, 5), "int32")
    assert jd.TensorSpec.from_tensor([1.0, 2.0]) == jd.TensorSpec((2,), "float64")
    struct = jax.ShapeDtypeStruct((4,), jnp.int32)
    assert jd.TensorSpec.from_spec(struct) == jd.TensorSpec((4,), "int32")
    assert jd.TensorSpec.from_spec(jd.TensorSpec((None,), "int8", "a")).name == "a"


def test_element_specs_print_alike_on_every_jax(strategy):
    """TF's element_spec (a None batch dimension), the same text on JAX 0.10 and 0.12."""
    x = {"x": np.zeros((16, 3), np.float32), "y": np.zeros((16,), np.int32)}
    dist = strategy.experimental_distribute_dataset([x])
    expected = (
        "{'x': TensorSpec(shape=(None, 3), dtype=float32, name=None), "
        "'y': TensorSpec(shape=(None,), dtype=int32, name=None)}"
    )
    assert repr(dist.element_spec) == repr(iter(dist).element_spec) == expected
    fn = strategy.distribute_datasets_from_function(lambda ctx: [np.float32(1.0)])
    assert repr(fn.element_spec) == "TensorSpec(shape=(), dtype=float32, name=None)"
    vectors = strategy.experimental_distribute_dataset([np.arange(8.0)])
    assert vectors.element_spec == jd.TensorSpec((None,), jnp.float32)
    with pytest.warns(DeprecationWarning, match="experimental_make_numpy_dataset"):
        ds = strategy.experimental_make_numpy_dataset(np.zeros((6, 2), np.float32)).batch(4)
    assert repr(ds.element_spec) == "TensorSpec(shape=(None, 2), dtype=float32, name=None)"
    assert all(
        ds.element_spec.is_compatible_with(b) for b in ds
    )  # every batch, the partial last one included


def test_numpy_2_array_protocol_without_deprecation_warnings():
    """`__array__` takes numpy 2's ``dtype`` and ``copy``: no DeprecationWarning from jaxdist."""
    m = jd.Mirrored((jnp.arange(3.0), jnp.arange(3.0)))
    p = jd.PerReplica((jnp.ones(2), jnp.zeros(2)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.asarray(m).tolist() == [0.0, 1.0, 2.0]
        assert np.asarray(m, dtype=np.int32).dtype == np.int32
        copied = np.array(m, copy=True)
        copied[0] = 7.0
        assert np.asarray(m)[0] == 0.0  # a copy, not a view of the replica's buffer
        for convert in (np.asarray, np.array, lambda v: np.array(v, copy=True)):
            with pytest.raises(TypeError, match="holds a different value on each replica"):
                convert(p)
