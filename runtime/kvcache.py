"""Preallocated KV cache with a named committed length (contracts.py, issue 3 decision).

One buffer per layer and kind, ``[1, MAX, KVH, D]``, and a committed length ``n``:

    feed      past_key(i) = K[i][:, :n]          a view: contiguous prefix, no copy
    run       graph returns new_key(i) [1, S, KVH, D] for the S new positions only
    commit a  K[i][:, n:n+a] = new[:, :a]; n += a   O(a) copy of accepted rows
    rollback  n = m (m <= n)                        O(1): rows past n are dead

Rejected drafts are never written, so a verify round commits ``accepted + 1`` rows (the
last committed token's slot plus the accepted drafts) and needs no rollback; rollback
exists for callers that commit speculatively (e.g. a draft's scratch rows).

``layout="inplace"`` (engines whose graph updates the buffers itself, contracts.py
"In-place KV"): buffers ``[1, KVH, MAX, D]``, fed whole as ``cache_key(i)``; the engine
writes the S new rows at positions n..n+S-1, so commit is ``n += a`` (O(1)) and the
rejected rows past n are dead until the next call overwrites them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from specrt import contracts
from specrt.errors import InternalError, UserError


class KVCache:
    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, max_len: int, dtype="float32",
                 layout: str = "append"):
        for name, v in (("num_layers", num_layers), ("kv_heads", kv_heads), ("head_dim", head_dim), ("max_len", max_len)):
            if not isinstance(v, (int, np.integer)) or v < 1:  # (10.0 was numpy's TypeError at np.zeros)
                raise UserError(f"KV cache {name}={v!r}: expected a positive integer")
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise UserError(f"KV cache dtype {dtype!r}: expected a numpy float dtype (float32, float16)") from None
        if dt.kind != "f":
            raise UserError(f"KV cache dtype {dtype!r}: expected a numpy float dtype (float32, float16)")
        if layout not in contracts.KV_LAYOUTS:
            raise InternalError(f"KV layout {layout!r} is not one of {contracts.KV_LAYOUTS}")
        self.layout = layout
        shape = (1, max_len, kv_heads, head_dim) if layout == "append" else (1, kv_heads, max_len, head_dim)
        self.keys = [np.zeros(shape, dt) for _ in range(num_layers)]  # [1, MAX, KVH, D] each (append)
        self.values = [np.zeros(shape, dt) for _ in range(num_layers)]
        self.max_len = max_len
        self._n = 0

    @property
    def length(self) -> int:
        """n: committed positions; rows [n, MAX) hold nothing valid."""
        return self._n

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    def check_room(self, new_tokens: int) -> None:
        """UserError unless ``new_tokens`` more positions fit in the context limit."""
        if self._n + new_tokens > self.max_len:
            raise UserError(
                f"context limit reached: {self._n} cached + {new_tokens} new tokens > max_len {self.max_len}; "
                "shorten the prompt or max_new_tokens, or rebuild with a larger max length")

    def past_feeds(self, key_name: Callable[[int], str] = contracts.past_key,
                   value_name: Callable[[int], str] = contracts.past_value) -> dict[str, np.ndarray]:
        """{past_key(i): K[i][:, :n], past_value(i): V[i][:, :n]}: views [1, n, KVH, D], no copy.
        In-place layout: {cache_key(i): K[i], cache_value(i): V[i]}, the whole buffers."""
        n, feeds = self._n, {}
        if self.layout == "inplace":
            for i, (k, v) in enumerate(zip(self.keys, self.values)):
                feeds[contracts.cache_key(i)] = k
                feeds[contracts.cache_value(i)] = v
            return feeds
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            feeds[key_name(i)] = k[:, :n]
            feeds[value_name(i)] = v[:, :n]
        return feeds

    def commit(self, new_kv: Mapping[str, np.ndarray], count: int,
               key_name: Callable[[int], str] = contracts.new_key,
               value_name: Callable[[int], str] = contracts.new_value) -> None:
        """Append the first ``count`` of the S new rows of every layer: buf[:, n:n+count] = new[:, :count]."""
        if count == 0:
            return
        self.check_room(count)
        n = self._n
        if self.layout == "inplace":  # the engine wrote rows n.. itself; check it was this cache
            k0 = new_kv.get(contracts.cache_key_out(0))
            if k0 is None or k0.ctypes.data != self.keys[0].ctypes.data:
                raise InternalError("commit: the outputs are not this in-place cache's buffers")
            if count < 0:  # commit only appends (the append layout's shape check refuses it too)
                raise InternalError(f"commit: cannot take {count} rows")
            self._n = n + count
            return
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            for buf, name in ((k, key_name(i)), (v, value_name(i))):
                new = new_kv.get(name)
                if new is None:
                    raise InternalError(f"commit: graph outputs lack {name!r}")
                if new.ndim != 4 or new.shape[0] != 1 or new.shape[2:] != buf.shape[2:] or not 0 <= count <= new.shape[1]:
                    raise InternalError(f"commit: {name} has shape {new.shape}, cannot take {count} rows of [1, S, {buf.shape[2]}, {buf.shape[3]}]")
                buf[:, n : n + count] = new[:, :count]
        self._n = n + count

    def move_row(self, src: int, dst: int) -> None:
        """In-place layout: copy buffer slot ``src`` to slot ``dst`` in every layer's K and V
        (a token tree's accepted sibling, written after the chain, to the slot after the
        committed ones: contracts.py "Token trees"). One row per layer, O(layers)."""
        if self.layout != "inplace":
            raise InternalError("move_row: only the in-place layout holds rows past the committed length")
        if not (0 <= dst < self.max_len and 0 <= src < self.keys[0].shape[2]):
            raise InternalError(f"move_row {src} -> {dst} outside the buffers ({self.keys[0].shape[2]} rows)")
        for k, v in zip(self.keys, self.values):
            k[:, :, dst] = k[:, :, src]
            v[:, :, dst] = v[:, :, src]

    def save_rows(self, n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Copies of rows [0, n) of every layer's K and V (a prefix snapshot, load_rows
        puts them back)."""
        if not 0 <= n <= self._n:
            raise InternalError(f"save_rows {n} outside [0, {self._n}]")
        cut = (slice(None), slice(0, n)) if self.layout == "append" else (slice(None), slice(None), slice(0, n))
        return [k[cut].copy() for k in self.keys], [v[cut].copy() for v in self.values]

    def saved_length(self, rows: tuple[list[np.ndarray], list[np.ndarray]]) -> int:
        """n, the rows a ``save_rows`` copy holds."""
        return rows[0][0].shape[1 if self.layout == "append" else 2]

    def load_rows(self, rows: tuple[list[np.ndarray], list[np.ndarray]]) -> None:
        """Rows [0, n) of every layer from ``save_rows``; the committed length becomes n."""
        keys, values = rows
        n = self.saved_length(rows)
        if len(keys) != len(self.keys) or not n <= self.max_len:
            raise InternalError(f"load_rows: {len(keys)} layers of {n} rows do not fit this cache")
        cut = (slice(None), slice(0, n)) if self.layout == "append" else (slice(None), slice(None), slice(0, n))
        for buf, new in zip(self.keys + self.values, keys + values):
            buf[cut] = new
        self._n = n

    def rollback(self, to_length: int) -> None:
        """Forget positions [to_length, n): O(1), only ever shrinks."""
        if not 0 <= to_length <= self._n:
            raise InternalError(f"rollback to {to_length} outside [0, {self._n}]")
        self._n = to_length

    def reset(self) -> None:
        self._n = 0
