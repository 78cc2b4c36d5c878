import numpy as np
import pytest

from specrt import contracts
from specrt.errors import InternalError, UserError
from specrt.runtime.kvcache import KVCache

L, KVH, D, MAX = 2, 3, 4, 10


def new_rows(s, start, cache=None):
    """Graph outputs for S new positions; row j of layer i holds value 1000 i + start + j."""
    out = {}
    for i in range(L):
        rows = (1000 * i + start + np.arange(s, dtype=np.float32))[None, :, None, None]
        out[contracts.new_key(i)] = np.broadcast_to(rows, (1, s, KVH, D)).copy()
        out[contracts.new_value(i)] = -out[contracts.new_key(i)]
    return out


def test_feeds_are_contiguous_views_without_copy():
    c = KVCache(L, KVH, D, MAX)
    c.commit(new_rows(3, 0), 3)
    feeds = c.past_feeds()
    assert sorted(feeds) == sorted([contracts.past_key(i) for i in range(L)] + [contracts.past_value(i) for i in range(L)])
    for i in range(L):
        k, v = feeds[contracts.past_key(i)], feeds[contracts.past_value(i)]
        assert k.shape == v.shape == (1, 3, KVH, D)
        assert np.shares_memory(k, c.keys[i]) and np.shares_memory(v, c.values[i])
        assert k.flags.c_contiguous and v.flags.c_contiguous
        assert k.base is c.keys[i]
    assert c.past_feeds()[contracts.past_key(0)].shape == (1, 3, KVH, D)
    assert KVCache(L, KVH, D, MAX).past_feeds()[contracts.past_key(1)].shape == (1, 0, KVH, D)


def test_commit_copies_only_the_accepted_rows():
    c = KVCache(L, KVH, D, MAX, "float16")
    c.commit(new_rows(2, 0), 2)  # prefill of 2
    c.commit(new_rows(5, 100), 3)  # verify of S = 5, a + 1 = 3 accepted rows
    assert c.length == 5
    k1 = c.past_feeds()[contracts.past_key(1)]
    assert k1.dtype == np.float16
    assert k1[0, :, 0, 0].tolist() == [1000, 1001, 1100, 1101, 1102]
    assert c.past_feeds()[contracts.past_value(0)][0, :, 1, 2].tolist() == [0, -1, -100, -101, -102]
    assert (c.keys[0][:, 5:] == 0).all()  # rejected rows never written
    c.commit(new_rows(1, 7), 0)
    assert c.length == 5


def test_rollback_is_o1_and_only_shrinks():
    c = KVCache(L, KVH, D, MAX)
    c.commit(new_rows(6, 0), 6)
    before = c.keys[0].copy()
    c.rollback(4)
    assert c.length == 4 and (c.keys[0] == before).all()  # nothing touched
    c.commit(new_rows(2, 50), 2)  # overwrites the forgotten rows
    assert c.past_feeds()[contracts.past_key(0)][0, :, 0, 0].tolist() == [0, 1, 2, 3, 50, 51]
    with pytest.raises(InternalError, match="rollback to 9"):
        c.rollback(9)
    with pytest.raises(InternalError):
        c.rollback(-1)
    c.reset()
    assert c.length == 0


def test_overflow_is_a_user_error_naming_the_limit():
    c = KVCache(L, KVH, D, MAX)
    c.commit(new_rows(8, 0), 8)
    c.check_room(2)
    with pytest.raises(UserError, match="max_len 10"):
        c.check_room(3)
    with pytest.raises(UserError, match="context limit"):
        c.commit(new_rows(3, 0), 3)
    assert c.length == 8


def test_bad_graph_outputs_are_internal_errors():
    c = KVCache(L, KVH, D, MAX)
    rows = new_rows(2, 0)
    del rows[contracts.new_value(1)]
    with pytest.raises(InternalError, match="new_value.1"):
        c.commit(rows, 2)
    with pytest.raises(InternalError, match="cannot take 3 rows"):
        c.commit(new_rows(2, 0), 3)
    with pytest.raises(InternalError, match="shape"):
        c.commit({k: v[..., :2] for k, v in new_rows(2, 0).items()}, 1)
    with pytest.raises(InternalError, match="shape"):  # a batch of 2: not this cache's rows
        c.commit({k: np.concatenate([v, v]) for k, v in new_rows(2, 0).items()}, 1)
    assert c.length == 0


def test_bad_construction_is_a_user_error():
    with pytest.raises(UserError, match="max_len"):
        KVCache(L, KVH, D, 0)
    with pytest.raises(UserError, match="dtype"):
        KVCache(L, KVH, D, MAX, "int8")
    with pytest.raises(UserError, match="dtype"):
        KVCache(L, KVH, D, MAX, "bfloat16")


def test_inplace_layout_feeds_whole_buffers_and_commits_by_length():
    """In-place KV: the engine writes rows n..n+S-1 into the buffers it was fed; commit only
    moves the length, rollback too, and outputs that are not this cache's buffers are a bug."""
    kv = KVCache(2, 3, 4, 16, layout="inplace")
    feeds = kv.past_feeds()
    assert set(feeds) == {contracts.cache_key(i) for i in range(2)} | {contracts.cache_value(i) for i in range(2)}
    assert feeds[contracts.cache_key(1)] is kv.keys[1] and kv.keys[1].shape == (1, 3, 16, 4)
    outs = {contracts.cache_key_out(i): kv.keys[i] for i in range(2)}
    kv.keys[0][0, :, 0:5] = 1.0  # what the engine wrote for 5 new positions
    kv.commit(outs, 3)  # 3 accepted: rows 3, 4 are dead
    assert kv.length == 3 and kv.keys[0][0, :, 3:5].sum() > 0  # nothing copied or cleared
    kv.rollback(1)
    assert kv.length == 1
    with pytest.raises(InternalError, match="not this in-place cache"):
        kv.commit({contracts.cache_key_out(0): np.zeros((1, 3, 16, 4), np.float32)}, 1)
    with pytest.raises(UserError, match="context limit"):
        kv.commit(outs, 16)
    with pytest.raises(InternalError, match="KV layout"):
        KVCache(2, 3, 4, 16, layout="sideways")


def test_move_row_copies_one_slot_of_every_layer():
    """A token tree's accepted sibling: its K/V row moves from the slot it was written at
    to the slot after the committed ones, in every layer; the append layout refuses."""
    kv = KVCache(2, 3, 4, 16, layout="inplace")
    for i, (k, v) in enumerate(zip(kv.keys, kv.values)):
        k[0, :, 9], v[0, :, 9] = 10.0 + i, 20.0 + i
    kv.move_row(9, 5)
    for i, (k, v) in enumerate(zip(kv.keys, kv.values)):
        assert (k[0, :, 5] == 10.0 + i).all() and (v[0, :, 5] == 20.0 + i).all()
        assert (k[0, :, 4] == 0).all() and (k[0, :, 6] == 0).all()
    with pytest.raises(InternalError, match="outside the buffers"):
        kv.move_row(16, 5)
    with pytest.raises(InternalError, match="outside the buffers"):
        kv.move_row(5, 16)
    with pytest.raises(InternalError, match="only the in-place layout"):
        KVCache(2, 3, 4, 16).move_row(3, 1)


@pytest.mark.parametrize("layout", ["append", "inplace"])
def test_save_and_load_rows_restore_a_prefix(layout):
    """A prefix snapshot: copies of rows [0, n) that load back into a cache whose rows were
    overwritten since, in either layout."""
    kv = KVCache(2, 2, 4, 16, layout=layout)
    rng = np.random.default_rng(0)
    for buf in kv.keys + kv.values:
        buf[...] = rng.standard_normal(buf.shape)
    kv._n = 10
    saved = kv.save_rows(7)
    before = [b.copy() for b in kv.keys + kv.values]
    for buf in kv.keys + kv.values:
        buf[...] = 0.0  # overwritten by another conversation
    kv.rollback(3)
    kv.load_rows(saved)
    assert kv.length == 7
    cut = (slice(None), slice(0, 7)) if layout == "append" else (slice(None), slice(None), slice(0, 7))
    for got, want in zip(kv.keys + kv.values, before):
        np.testing.assert_array_equal(got[cut], want[cut])
    saved[0][0][...] = 5.0  # copies: the snapshot does not alias the buffers
    assert not np.any(kv.keys[0][cut] == 5.0)
    with pytest.raises(InternalError):
        kv.save_rows(8)
    # another cache's snapshot (one layer fewer) is refused, not loaded into the layers it has
    with pytest.raises(InternalError, match="do not fit"):
        kv.load_rows(([k[:1] for k in saved[0]][:1], saved[1][:1]))
    assert kv.length == 7


# ---- mutation round on runtime/kvcache.py (mutants v01-v47; each test names those it kills) ----


# mutants v02 (a non-integer size accepted), v03 (num_layers not checked)
@pytest.mark.parametrize("sizes, words", [((0, KVH, D, MAX), "num_layers=0"), ((L, 0, D, MAX), "kv_heads=0"),
                                          ((L, KVH, 0, MAX), "head_dim=0"), ((L, KVH, D, 2.5), "max_len=2.5")])
def test_every_size_must_be_a_positive_integer(sizes, words):
    """Each of the four sizes is checked by name: a cache of no layer fed the graph nothing
    (an engine's error far from the cause), a fractional length was numpy's TypeError."""
    with pytest.raises(UserError, match=f"KV cache {words}: expected a positive integer"):
        KVCache(*sizes)


# mutant v11 (check_room's message: the cached and new counts swapped)
def test_the_context_limit_message_says_what_is_cached_and_what_is_new():
    """The user reads which number to shorten: 8 rows already cached, 3 asked for."""
    c = KVCache(L, KVH, D, MAX)
    c.commit(new_rows(8, 0), 8)
    with pytest.raises(UserError, match=r"context limit reached: 8 cached \+ 3 new tokens > max_len 10"):
        c.check_room(3)


# mutants v14 (cache_value(i) fed the key buffer), v19 (an in-place commit sets n = count, not n + count);
# test_inplace.py kills both through float16 engines, this without building any
def test_inplace_feeds_each_value_buffer_and_commits_accumulate():
    """In-place KV: cache_value(i) is layer i's own value buffer (the engine writes the new
    values into it), and successive commits add up: a prefill of 4, then 2 accepted rows, is 6."""
    kv = KVCache(2, 3, 4, 16, layout="inplace")
    feeds = kv.past_feeds()
    for i in range(2):
        assert feeds[contracts.cache_value(i)] is kv.values[i] and feeds[contracts.cache_key(i)] is kv.keys[i]
    outs = {contracts.cache_key_out(i): kv.keys[i] for i in range(2)}
    kv.commit(outs, 4)
    kv.commit(outs, 2)
    assert kv.length == 6
    with pytest.raises(UserError, match="6 cached"):
        kv.commit(outs, 11)


# mutants v28 (a negative dst accepted), v29 (a negative src accepted)
def test_move_row_refuses_negative_slots():
    """A negative slot is numpy's count from the end: row -1 is the buffer's last, a slot
    no token tree writes. Refused as a bug, nothing moved."""
    kv = KVCache(2, 3, 4, 16, layout="inplace")
    kv.keys[0][0, :, 15] = 7.0
    for src, dst in ((-1, 5), (5, -1)):
        with pytest.raises(InternalError, match=f"move_row {src} -> {dst} outside the buffers"):
            kv.move_row(src, dst)
    assert (kv.keys[0][0, :, 5] == 0).all() and (kv.keys[0][0, :, 15] == 7.0).all()


# mutant v33 (save_rows(-1) accepted: every row but the last)
def test_save_rows_refuses_a_negative_count():
    c = KVCache(L, KVH, D, MAX)
    c.commit(new_rows(4, 0), 4)
    with pytest.raises(InternalError, match=r"save_rows -1 outside \[0, 4\]"):
        c.save_rows(-1)


# mutant v37 (load_rows of a snapshot longer than the buffers: numpy's broadcast ValueError)
def test_load_rows_refuses_a_snapshot_longer_than_the_buffers():
    """A snapshot of another cache's 12 rows does not fit one of max_len 8: an InternalError
    naming it, and the cache keeps its length."""
    big, small = KVCache(L, KVH, D, 16), KVCache(L, KVH, D, 8)
    big.commit(new_rows(12, 0), 12)
    small.commit(new_rows(3, 0), 3)
    with pytest.raises(InternalError, match="2 layers of 12 rows do not fit"):
        small.load_rows(big.save_rows(12))
    assert small.length == 3


# mutant v44 (the value buffers float32 whatever the dtype; test_inplace.py kills it through float16 engines)
@pytest.mark.parametrize("layout", ["append", "inplace"])
def test_keys_and_values_take_the_cache_dtype(layout):
    """The engines' past inputs are typed: a float16 engine fed float32 values is refused by
    ONNX Runtime at the first call, so both buffers of every layer take the cache's dtype."""
    c = KVCache(L, KVH, D, MAX, "float16", layout=layout)
    assert {b.dtype for b in c.keys + c.values} == {np.dtype(np.float16)}
    assert {f.dtype for f in c.past_feeds().values()} == {np.dtype(np.float16)}


# ---- mutation round of session 68 on runtime/kvcache.py (mutants K01-K68; each test names those it kills) ----


# mutant K05 (a complex dtype taken: numpy's kind "c" beside "f")
def test_a_complex_dtype_is_refused():
    """The engines' past inputs are float16 or float32 tensors: complex64 is a numpy dtype but no KV dtype."""
    with pytest.raises(UserError, match="KV cache dtype 'complex64': expected a numpy float dtype"):
        KVCache(L, KVH, D, MAX, "complex64")


# mutants K18 (a negative count returns as 0 does), K26 (a negative count taken: new[:, :-1] broadcast into
# the empty rows [n, n - 1), the length shrunk by one); the in-place layout took it as a shrink (the fix)
@pytest.mark.parametrize("layout", ["append", "inplace"])
def test_a_negative_commit_count_is_refused(layout):
    """A commit only appends (rollback shrinks): a negative count is a caller's bug, refused
    in either layout with the length and the rows as they were."""
    c = KVCache(L, KVH, D, MAX, layout=layout)
    outs = new_rows(2, 0) if layout == "append" else {contracts.cache_key_out(i): c.keys[i] for i in range(L)}
    c.commit(outs, 2)
    before = [b.copy() for b in c.keys + c.values]
    with pytest.raises(InternalError, match="cannot take -1 rows"):
        c.commit(outs if layout == "inplace" else new_rows(2, 50), -1)
    assert c.length == 2 and all((b == a).all() for b, a in zip(c.keys + c.values, before))


# mutant K24 (the ndim check dropped: a 0-d output was numpy's IndexError, not the contract's error)
def test_a_scalar_graph_output_is_an_internal_error():
    c = KVCache(L, KVH, D, MAX)
    with pytest.raises(InternalError, match=r"commit: .* has shape \(\), cannot take 1 rows"):
        c.commit({k: np.zeros((), np.float32) for k in new_rows(1, 0)}, 1)
    assert c.length == 0


# mutant K42 (load_rows refused a snapshot of exactly max_len rows)
@pytest.mark.parametrize("layout", ["append", "inplace"])
def test_a_snapshot_of_a_full_cache_loads_back(layout):
    """A prefix snapshot of every row the cache holds (n = max_len) fits it: it was saved from it."""
    c = KVCache(L, KVH, D, MAX, layout=layout)
    for buf in c.keys + c.values:
        buf[...] = np.arange(buf.size, dtype=np.float32).reshape(buf.shape)
    c._n = MAX
    saved = c.save_rows(MAX)
    want = [b.copy() for b in c.keys + c.values]
    for buf in c.keys + c.values:
        buf[...] = 0.0
    c.rollback(2)
    c.load_rows(saved)
    assert c.length == MAX and all((b == w).all() for b, w in zip(c.keys + c.values, want))


# mutant K53 (in-place outputs lacking cache_key_out(0): None.ctypes, an AttributeError)
def test_inplace_outputs_without_the_first_layers_key_are_an_internal_error():
    kv = KVCache(2, 3, 4, 16, layout="inplace")
    with pytest.raises(InternalError, match="not this in-place cache's buffers"):
        kv.commit({contracts.cache_key_out(1): kv.keys[1]}, 1)
    assert kv.length == 0


# a bug found in this round (mutants K02c, K02d of its fix): a whole float size passed the integer check
def test_a_whole_float_size_is_a_user_error_and_a_numpy_integer_a_size():
    """10.0 passed the integer check (int(10.0) == 10.0) and was numpy's TypeError at the
    allocation; a numpy integer (a size read from an array's shape) is a size."""
    with pytest.raises(UserError, match=r"KV cache max_len=10.0: expected a positive integer"):
        KVCache(L, KVH, D, 10.0)
    c = KVCache(np.int64(L), KVH, D, np.int64(MAX))
    assert c.keys[1].shape == (1, MAX, KVH, D) and c.num_layers == L  # (mutant K68: keys and values counted)
