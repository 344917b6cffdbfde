"""Checkpoint checksums: any changed word is seen, host and device agree, records compare."""

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax import checkpoint_integrity as integrity

_DTYPES = [np.float32, jnp.bfloat16, np.float16, np.int32, np.uint32, np.int8, np.bool_]


def _sums(x):
  return integrity.checks({"x": x})["x"][:2]


def _device_sums(x):
  """The sums computed on the device (jitted), as for accelerators and multi-process arrays."""
  return integrity.device_checks({"x": jnp.asarray(x)})["x"][:2]


@hypothesis.settings(max_examples=60)
@hypothesis.given(
    dtype=st.sampled_from(_DTYPES),
    shape=st.lists(st.integers(1, 5), min_size=0, max_size=3),
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
)
def test_any_single_changed_word_changes_both_sums(dtype, shape, seed, data):
  rng = np.random.default_rng(seed)
  itemsize = np.dtype(dtype).itemsize
  words = rng.integers(0, 2 ** (8 * itemsize), size=shape, dtype=np.uint64)
  bits = words.astype({1: np.uint8, 2: np.uint16, 4: np.uint32}[itemsize])
  array = (bits & 1).astype(np.bool_) if dtype is np.bool_ else bits.view(dtype)
  where = data.draw(st.integers(0, array.size - 1))
  changed = array.copy().reshape(-1)
  if dtype is np.bool_:
    changed[where] = not changed[where]
  else:
    raw = changed.view(bits.dtype)
    raw[where] ^= data.draw(st.integers(1, 2 ** (8 * itemsize) - 1))
  changed = changed.reshape(array.shape)
  before, after = _device_sums(array), _device_sums(changed)
  assert before[0] != after[0] and before[1] != after[1]
  # Host arrays (numpy, and CPU arrays) get the same sums as the same values on a device.
  assert _sums(array) == _sums(jnp.asarray(array)) == before
  assert _sums(changed) == _sums(jnp.asarray(changed)) == after


def test_swapped_words_change_the_weighted_sum():
  x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
  swapped = x.at[0, 0].set(x[2, 3]).at[2, 3].set(x[0, 0])
  for sums in (_sums, _device_sums):
    (plain_a, weighted_a), (plain_b, weighted_b) = sums(x), sums(swapped)
    assert plain_a == plain_b and weighted_a != weighted_b


def test_sums_worked_by_hand_and_eight_byte_words_split_low_first():
  # Words 1, 2, 3 weigh 1, 3, 5: 1 + 6 + 15 = 22; a word of 2^32 - 1 plus 1 wraps to 0.
  assert _sums(np.array([1, 2, 3], np.uint32)) == (6, 22)
  assert _sums(np.array([2**32 - 1, 1], np.uint32)) == (0, 2)
  # 1.0 as float64 is the words (0, 0x3FF00000): only the second, weighted by 3, counts.
  assert _sums(np.array([1.0], np.float64)) == (0x3FF00000, (3 * 0x3FF00000) % 2**32)
  with jax.enable_x64(True):
    assert _device_sums(np.array([1.0], np.float64)) == _sums(np.array([1.0], np.float64))


def test_finiteness_and_damage_name_the_entry():
  flat = {"['a']": jnp.ones(3), "['n']": jnp.arange(3)}
  rec = integrity.record(flat, integrity.checks(flat))
  assert integrity.damage(rec, flat) is None
  assert rec["['a']"]["shape"] == [3] and rec["['n']"]["dtype"] == "int32"
  bad = dict(flat, **{"['a']": jnp.array([1.0, np.inf, 1.0])})
  assert integrity.damage(None, bad) == "['a'] holds NaN or inf"  # no record: finiteness only
  assert integrity.device_checks({"a": bad["['a']"], "n": flat["['n']"]}) == {
      "a": (*integrity.checks({"a": np.asarray(bad["['a']"])})["a"][:2], False),
      "n": (*integrity.checks({"n": np.arange(3, dtype=np.int32)})["n"][:2], True),
  }
  assert "['a'] does not match the checksum" in integrity.damage(rec, bad)
  assert integrity.damage(rec, dict(flat, **{"['n']": jnp.array([0, 1, 3])})) == (
      "['n'] does not match the checksum saved with it"
  )


@pytest.mark.parametrize(
    "saved, expected, message",
    [
        ({"a": ((2,), "float32")}, {"a": ((2,), "float32")}, None),
        ({}, {"a": ((2,), "float32")}, "it has no entry a"),
        ({"a": ((2,), "float32"), "b": ((), "int32")}, {"a": ((2,), "float32")}, "unexpected "),
        (
            {"a": ((2,), "float32")},
            {"a": ((3,), "float32")},
            "a is float32[2] there but float32[3]",
        ),
        ({"a": ((2,), "bfloat16")}, {"a": ((2,), "float32")}, "a is bfloat16[2] there but"),
    ],
)
def test_difference_names_the_first_mismatch(saved, expected, message):
  found = integrity.difference(saved, expected)
  assert found is None if message is None else message in found


def test_host_and_device_arrays_are_checked_together_in_order():
  flat = {"a": jnp.arange(4), "b": np.arange(4, dtype=np.int32), "c": jnp.ones(2)}
  sums = integrity.checks(flat)
  assert list(sums) == ["a", "b", "c"] and sums["a"] == sums["b"] == (6, 0 + 3 + 10 + 21, True)
