"""Synthetic, learnable token data that needs no network: a seeded sparse Markov chain.

Each token has two successors, taken with probability 0.9 and 0.1, so a model that learns
the chain predicts the next token well and the loss falls visibly.  Each worker walks a pool
of sequences once; a batch is then a pure function of (seed, step, worker): resuming at step
N reproduces exactly the batch an uninterrupted run would have seen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class MarkovChain:
    """The chain's successor table, fixed by the seed."""

    successors: Tensor  # [vocab, 2]
    vocab: int

    @classmethod
    def build(cls, vocab: int, seed: int) -> MarkovChain:
        gen = torch.Generator().manual_seed(seed)
        return cls(torch.randint(0, vocab, (vocab, 2), generator=gen), vocab)


@dataclass(frozen=True)
class Batch:
    """Tokens for the target's context, the draft blocks' inputs and labels, and the anchors."""

    context: Tensor  # [B, S] token ids
    block_inputs: Tensor  # [B, K*bs]: anchor token then MASK tokens
    labels: Tensor  # [B, K*bs]: the true next tokens (-100 where no prediction is made)
    anchors: Tensor  # [B, K]


def sample_sequences(chain: MarkovChain, count: int, length: int, gen: torch.Generator) -> Tensor:
    """``count`` sequences of ``length`` tokens walked along the chain."""
    seq = torch.empty(count, length, dtype=torch.long)
    seq[:, 0] = torch.randint(0, chain.vocab, (count,), generator=gen)
    choice = (torch.rand(count, length, generator=gen) > 0.9).long()
    for t in range(1, length):
        seq[:, t] = chain.successors[seq[:, t - 1], choice[:, t]]
    return seq


@dataclass(frozen=True)
class SequencePool:
    """Sequences walked once at start-up; steps draw rows and anchors from it.

    Walking the chain is a Python loop over positions, too slow to repeat every step at GPU
    sizes (it would starve the GPUs); drawing from a pool keeps the main thread's share small.
    """

    sequences: Tensor  # [size, ctx_len + block_size]

    @classmethod
    def build(
        cls, chain: MarkovChain, *, seed: int, worker: int, size: int, length: int
    ) -> SequencePool:
        gen = torch.Generator().manual_seed(seed * 7919 + worker)
        return cls(sample_sequences(chain, size, length, gen))


def make_batch(
    pool: SequencePool,
    *,
    seed: int,
    step: int,
    worker: int,
    batch: int,
    ctx_len: int,
    blocks: int,
    block_size: int,
    mask_token: int,
) -> Batch:
    """Draw ``batch`` sequences, choose ``blocks`` anchors per sequence, build block inputs and labels.

    A pure function of (pool, seed, step, worker): a resumed run sees exactly the batches an
    uninterrupted one would have.
    """
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 131 + worker)
    rows = torch.randint(0, pool.sequences.shape[0], (batch,), generator=gen)
    seq = pool.sequences[rows]
    # Anchors: distinct sorted positions in [1, ctx_len - block_size], one block each.
    scores = torch.rand(batch, ctx_len - block_size, generator=gen)
    anchors = scores.topk(blocks, dim=1).indices.sort(dim=1).values + 1
    offsets = torch.arange(block_size)
    positions = anchors.unsqueeze(-1) + offsets  # [B, K, bs]
    block_tokens = torch.gather(seq, 1, positions.flatten(1)).view(batch, blocks, block_size)
    inputs = torch.full_like(block_tokens, mask_token)
    inputs[:, :, 0] = block_tokens[:, :, 0]
    labels = torch.gather(seq, 1, (positions + 1).flatten(1)).view(batch, blocks, block_size)
    labels[:, :, -1] = -100  # the last slot's next token lies beyond the block
    return Batch(seq[:, :ctx_len], inputs.flatten(1), labels.flatten(1), anchors)
