"""KV storage of the embedded engine: a slot cache for the running batch and an LRU of finished prefixes.

SlotKVCache keeps every layer's keys and values in ONE preallocated tensor

    kv[2, layers, rows, kv_heads, capacity, head_dim]

with one row per running sequence. A sequence's token at position p lives in slot p of its row:
slot == position id, no padding holes. So one decoding step writes one slot per row (a scatter,
`index_put_`), and attention reads the view `kv[.., :n_rows, :, :L]` through a boolean mask
`slot <= position` (the engine builds it). Nothing is concatenated or re-padded per step; the buffer
only grows (geometrically, copying once) when more rows or a longer capacity is needed.

The object plugs into a Hugging Face model as its `cache`: the attention modules call
`update(keys, values, layer_idx)` with the new projected (post-RoPE) keys/values, get back the
rows' full views, and the model's own attention kernel (SDPA) does the rest. `bind` tells the cache,
before each forward pass, which rows the batch occupies and which slot every query token writes.

PrefixCache keeps the KV of finished requests keyed by their sticky request id (bounded by bytes,
least recently used first out), so the next turn of a multi-turn agent prefills only its new suffix;
a request with no entry of its own may still copy the longest prefix it shares with any entry (the
system prompt every episode starts with).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class SlotKVCache:
    """Per-row KV slots for a batch of sequences (see the module docstring)."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", length_multiple: int = 128):
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.length_multiple = length_multiple
        self.kv: torch.Tensor | None = None
        self._row0 = 0
        self._rows = 0
        self._row_index: torch.Tensor | None = None
        self._slots: torch.Tensor | None = None
        self._length = 0

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def bytes_per_token(self) -> int:
        """Bytes of keys + values one token occupies across all layers."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * elem

    @property
    def rows_capacity(self) -> int:
        return 0 if self.kv is None else self.kv.shape[2]

    @property
    def capacity(self) -> int:
        """Slots per row currently allocated."""
        return 0 if self.kv is None else self.kv.shape[4]

    @property
    def allocated_bytes(self) -> int:
        return 0 if self.kv is None else self.kv.numel() * self.kv.element_size()

    def ensure(self, rows: int, length: int, length_hint: int = 0) -> None:
        """Make room for `rows` rows of `length` slots, keeping the current contents.

        Length grows geometrically (x1.5, but not past `length_hint`, the longest any running sequence
        can get), rows in steps of 8, lengths in steps of `length_multiple`, so a run copies the buffer
        only a few times and never holds much more than it can use. The buffer starts zeroed: attention
        reads slots past a row's length (masked, weight 0), and 0 * NaN from uninitialised memory would
        still poison the output.
        """
        if self.kv is not None and rows <= self.rows_capacity and length <= self.capacity:
            return
        new_rows = _round_up(max(rows, self.rows_capacity, 1), 8)
        new_len = length
        if length > self.capacity:
            grown = int(self.capacity * 1.5)
            new_len = max(length, min(grown, length_hint) if length_hint else grown)
        new_len = _round_up(max(new_len, self.capacity), self.length_multiple)
        fresh = torch.zeros((2, self.n_layers, new_rows, self.n_kv_heads, new_len, self.head_dim),
                            dtype=self.dtype, device=self.device)
        if self.kv is not None:
            fresh[:, :, : self.rows_capacity, :, : self.capacity] = self.kv
        self.kv = fresh

    def release(self) -> None:
        """Free the buffer (the engine does this when it goes idle)."""
        self.kv = None

    # ---- the forward-pass interface (called by the model's attention layers) -------------------
    def bind(self, row0: int, rows: int, slots: torch.Tensor, length: int) -> None:
        """Before a forward pass: the batch is rows [row0, row0+rows); query token (r, t) writes slot
        `slots[r, t]`; attention sees slots [0, length) of each row."""
        assert self.kv is not None and row0 + rows <= self.rows_capacity and length <= self.capacity
        self._row0, self._rows, self._length = row0, rows, length
        self._row_index = torch.arange(row0, row0 + rows, device=self.device)[:, None]
        self._slots = slots

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Scatter the new keys/values [rows, heads, T, dim] into their slots; return the rows' views."""
        k_buf, v_buf = self.kv[0, layer_idx], self.kv[1, layer_idx]
        # advanced indices on dims 0 and 2 around a slice: the indexed shape is [rows, T, heads, dim]
        k_buf[self._row_index, :, self._slots] = key_states.transpose(1, 2).to(self.dtype)
        v_buf[self._row_index, :, self._slots] = value_states.transpose(1, 2).to(self.dtype)
        rows = slice(self._row0, self._row0 + self._rows)
        return k_buf[rows, :, : self._length], v_buf[rows, :, : self._length]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Models only ask this when no position ids are given; the engine always gives them."""
        return self._length

    # ---- row bookkeeping ---------------------------------------------------------------------
    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` slots of row `src` into row `dst` (batch compaction)."""
        if src != dst and length:
            self.kv[:, :, dst, :, :length] = self.kv[:, :, src, :, :length]

    def read_row(self, row: int, length: int) -> torch.Tensor:
        """A copy of a row's first `length` slots: [2, layers, heads, length, dim]."""
        return self.kv[:, :, row, :, :length].clone()

    def write_row(self, row: int, data: torch.Tensor) -> None:
        """Put a `read_row` copy back into the first slots of `row`."""
        self.kv[:, :, row, :, : data.shape[3]] = data


@dataclass
class PrefixEntry:
    token_ids: list[int]
    """Tokens whose keys/values `kv` holds (slot i = token i)."""
    kv: torch.Tensor
    """[2, layers, heads, len(token_ids), dim]."""
    ids: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.ids = np.asarray(self.token_ids, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


class PrefixCache:
    """LRU map request_id -> KV of that request's last call, bounded by total bytes."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, PrefixEntry] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.shared_hits = 0
        self.misses = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, request_id: str, entry: PrefixEntry) -> None:
        self.pop(request_id)
        if entry.nbytes > self.max_bytes:
            return
        self._entries[request_id] = entry
        self.bytes += entry.nbytes
        while self.bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.nbytes

    def pop(self, request_id: str) -> PrefixEntry | None:
        entry = self._entries.pop(request_id, None)
        if entry is not None:
            self.bytes -= entry.nbytes
        return entry

    def take_match(self, request_id: str, prompt: list[int]) -> tuple[int, PrefixEntry | None]:
        """Remove the request's entry and say how many leading prompt tokens it covers.

        At least one prompt token is always left to prefill (its logits give the first sample), so a
        match covers min(common prefix, len(prompt) - 1) tokens; 0 means no reuse.
        """
        entry = self.pop(request_id)
        if entry is None:
            self.misses += 1
            return 0, None
        limit = min(len(entry.token_ids), len(prompt) - 1)
        n = 0
        while n < limit and entry.token_ids[n] == prompt[n]:
            n += 1
        if n == 0:
            self.misses += 1
            return 0, None
        self.hits += 1
        self.reused_tokens += n
        return n, entry

    def longest_shared(self, prompt: list[int], min_tokens: int = 16) -> tuple[int, PrefixEntry | None]:
        """The entry (of any request) sharing the longest prefix with `prompt` — e.g. the system prompt
        and few-shot examples every episode starts with. The entry stays cached (its KV is copied)."""
        query = np.asarray(prompt[:-1], dtype=np.int64)  # leave one token to prefill
        best, found = 0, None
        for key, entry in self._entries.items():
            m = min(len(query), len(entry.ids))
            if m <= best:
                continue
            same = query[:m] == entry.ids[:m]
            n = m if same.all() else int(np.argmin(same))
            if n > best:
                best, found = n, (key, entry)
        if found is None or best < min_tokens:
            return 0, None
        self._entries.move_to_end(found[0])
        self.shared_hits += 1
        self.reused_tokens += best
        return best, found[1]

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def stats(self) -> dict:
        return {"entries": len(self._entries), "bytes": self.bytes, "hits": self.hits,
                "shared_hits": self.shared_hits, "misses": self.misses, "reused_tokens": self.reused_tokens}
