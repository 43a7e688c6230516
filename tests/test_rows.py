import numpy as np
import pytest

from targetrows import RowStore
from targetrows.core.rows import check_rows


def test_exact_context_keys():
    """Verify at c, accept a, bonus a: the next root is caa; the row at ca is never returned there."""
    store = RowStore()
    c, a = [5, 9, 2], 7
    row_ca = np.array([0.5, 0.5])
    row_caa = np.array([0.1, 0.9])
    store.put(c + [a], row_ca)
    assert store.get(c + [a, a]) is None
    store.put(c + [a, a], row_caa)
    assert store.get(c + [a, a]) is row_caa
    assert store.get(c + [a]) is row_ca
    assert store.get([a, a]) is None  # same last tokens, different context
    assert len(store) == 2


def test_a_context_is_the_same_key_as_a_list_an_array_or_numpy_ints():
    store = RowStore()
    store.put(np.array([5, 9, 2]), "row")
    assert store.get([5, 9, 2]) == "row"
    assert store.get([np.int64(5), np.int32(9), 2]) == "row"
    assert store.get(np.array([5, 9], dtype=np.int32)) is None
    store.put([5, 9], "shorter")
    assert store.get(np.array([5, 9], dtype=np.int32)) == "shorter" and len(store) == 2


def test_bound_keeps_newest():
    store = RowStore(max_rows=2)
    for i in range(4):
        store.put([i], i)
    assert len(store) == 2
    assert store.get([0]) is None and store.get([3]) == 3
    with pytest.raises(ValueError, match="max_rows"):
        RowStore(max_rows=0)


@pytest.mark.parametrize(
    "rows, message",
    [
        ([[0.5, 0.6]], "sums to 1.1"),
        ([[np.nan, 1.0]], "NaN"),
        ([[-0.1, 1.1]], "negative"),
        ([[]], "non-empty"),
    ],
)
def test_bad_rows(rows, message):
    with pytest.raises(ValueError, match=message):
        check_rows(rows)
