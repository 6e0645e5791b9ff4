"""The DFlash training mask, written once as a flex_attention ``mask_mod``.

Queries are the draft blocks (``anchors`` blocks of ``block_size`` tokens each); keys and
values are ``[context ; draft blocks]``.  Block ``k`` sees the context *before* its anchor
(so each block is causal with respect to the context) and every token of its own block
(bidirectional within the block), nothing of other blocks.  The dense boolean mask for the
CPU path is derived from the very same function by ``create_mask``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import create_block_mask, create_mask

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def dflash_mask_mod(anchors: Tensor, ctx_len: int, block_size: int) -> MaskMod:
    """``anchors`` is a [batch, blocks] tensor of anchor positions in the context (kept by reference:
    update it in place and the same function describes the next batch, so nothing recompiles)."""

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        block = q_idx // block_size
        anchor = anchors[b, block]
        in_ctx = kv_idx < ctx_len
        sees_ctx = in_ctx & (kv_idx < anchor)
        same_block = (~in_ctx) & ((kv_idx - ctx_len) // block_size == block)
        return sees_ctx | same_block

    return mask_mod


def reference_mask(anchors: Tensor, ctx_len: int, block_size: int) -> Tensor:
    """The same mask by explicit loops, for the tests: [batch, Q, KV] booleans."""
    batch, blocks = anchors.shape
    q_len, kv_len = blocks * block_size, ctx_len + blocks * block_size
    out = torch.zeros(batch, q_len, kv_len, dtype=torch.bool)
    for b in range(batch):
        for k in range(blocks):
            rows = slice(k * block_size, (k + 1) * block_size)
            out[b, rows, : int(anchors[b, k])] = True
            out[b, rows, ctx_len + k * block_size : ctx_len + (k + 1) * block_size] = True
    return out


def dense_mask(
    mask_mod: MaskMod, batch: int, q_len: int, kv_len: int, device: torch.device
) -> Tensor:
    """[batch, 1, Q, KV] booleans from the mask_mod (True = may attend)."""
    return create_mask(mask_mod, batch, 1, q_len, kv_len, device=device)


def block_mask(
    mask_mod: MaskMod, batch: int, q_len: int, kv_len: int, device: torch.device
) -> object:
    """The flex BlockMask, built eagerly (compiling create_block_mask cost minutes in the research)."""
    return create_block_mask(mask_mod, batch, None, q_len, kv_len, device=device)
