"""The learner's attention: SDPA with a causal kernel where transformers would build a full mask.

transformers gives SDPA its `is_causal` flag (a kernel that skips the masked half of the score square) only
when queries and keys have the same length and nothing is padded. The learner's forwards are neither:
prompt-sharing rows continue from a cached prefix (queries are the last q of k positions) and pad-packed
rows are right-padded. Both then get a materialised [q, k] boolean mask, with which the CPU flash kernel
computes every block of the square: on long agent sequences, twice the attention work.

Both cases are plain causal attention, bottom-right aligned (query i sits at key position k - q + i):

    - right padding: pad keys sit after every real query of their row, so the causal rule alone keeps a
      real query off them. Pad queries attend to earlier tokens instead of nothing; the learner never
      reads their outputs (logits are gathered at real positions only), so nothing it computes changes.
    - a cached prefix: SDPA's `is_causal` is top-left aligned, so k - q zero queries are put in front
      (causal over the prefix only: (k - q)^2 / 2 extra scores) and their outputs dropped. Their output
      gradient is zero, so they add nothing to the keys' and values' gradients: exact.

`bottom_right_causal_mask` returns no mask in exactly those cases (else transformers' own `sdpa_mask`);
`bottom_right_causal_attention` runs them as above (else transformers' own SDPA forward). Registered
under ATTN_IMPLEMENTATION for the learner's model only (`model.set_attn_implementation`); engines and
exported configs keep `sdpa`.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTN_IMPLEMENTATION = "hexsearch_causal_sdpa"


def _right_padded(mask: torch.Tensor) -> bool:
    """Every row of the 2D 0/1 mask is ones then zeros (padding only at the end)."""
    m = mask.to(torch.int8)
    return bool((m[:, 1:] <= m[:, :-1]).all())


def bottom_right_causal_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                             attention_mask: torch.Tensor | None = None, allow_is_causal_skip: bool = True,
                             **kwargs) -> torch.Tensor | None:
    """None when the mask is plain bottom-right causal for every real query (see the module docstring)."""
    aligned = (isinstance(q_offset, int) and kv_offset == 0 and q_offset + q_length == kv_length
               and 1 < q_length <= kv_length)
    if allow_is_causal_skip and aligned and (
            attention_mask is None or (attention_mask.ndim == 2 and _right_padded(attention_mask[:, :kv_length]))):
        return None
    # transformers' own mask; its None then only ever means q == k (or a single query), never our case
    skip = allow_is_causal_skip and (q_length == kv_length or q_length == 1)
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask=attention_mask,
                     allow_is_causal_skip=skip, **kwargs)


def bottom_right_causal_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                  attention_mask: torch.Tensor | None, **kwargs):
    """SDPA; without a mask and with fewer queries than keys, causal bottom-right via leading zero queries."""
    q, k = query.shape[2], key.shape[2]
    if attention_mask is None and 1 < q < k:
        lead = query.new_zeros(query.shape[0], query.shape[1], k - q, query.shape[3])
        out, weights = sdpa_attention_forward(module, torch.cat([lead, query], dim=2), key, value, None, **kwargs)
        return out[:, k - q:], weights
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(ATTN_IMPLEMENTATION, bottom_right_causal_attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, bottom_right_causal_mask)
