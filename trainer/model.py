"""A tiny frozen target model and a DFlash-style drafter conditioned on its hidden states.

The drafter has no embedding or LM head of its own: it borrows the target's (frozen).  Target
hidden states from a few layers are concatenated and projected (``fc`` + RMSNorm) into context
features; every draft layer injects them as extra keys and values, and queries come only from
the draft blocks (the anchor token followed by MASK tokens).  One forward pass predicts every
position of every block in parallel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

AttentionCore = Callable[[Tensor, Tensor, Tensor, object], Tensor]


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of both models."""

    vocab: int = 64
    hidden: int = 64
    heads: int = 4
    target_layers: int = 2
    draft_layers: int = 2
    ctx_len: int = 128
    block_size: int = 8
    target_layer_ids: tuple[int, ...] = (0, 1)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def mask_token(self) -> int:
        return self.vocab  # one extra id after the real vocabulary


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class MLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, 3 * dim, bias=False)
        self.up = nn.Linear(dim, 3 * dim, bias=False)
        self.down = nn.Linear(3 * dim, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class TargetLayer(nn.Module):
    """A plain causal pre-norm block (the target runs eagerly, under no_grad)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.norm1, self.norm2 = RMSNorm(cfg.hidden), RMSNorm(cfg.hidden)
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden, bias=False)
        self.out = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.mlp = MLP(cfg.hidden)

    def forward(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.cfg.heads, self.cfg.head_dim).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.out(att.transpose(1, 2).reshape(b, s, -1))
        return x + self.mlp(self.norm2(x))


class TargetModel(nn.Module):
    """The frozen model whose hidden states condition the drafter (randomly initialised, seeded)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab + 1, cfg.hidden)
        self.pos = nn.Embedding(cfg.ctx_len, cfg.hidden)
        self.layers = nn.ModuleList(TargetLayer(cfg) for _ in range(cfg.target_layers))
        self.norm = RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab + 1, bias=False)
        self.layer_ids = cfg.target_layer_ids

    @torch.no_grad()
    def features(self, tokens: Tensor) -> Tensor:
        """Hidden states of the chosen layers, concatenated: [B, S, k*H]."""
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        picked = []
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i in self.layer_ids:
                picked.append(x)
        return torch.cat(picked, dim=-1)


class DraftLayer(nn.Module):
    """Queries from the block, keys/values from [context features ; block], one attention core."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.norm1, self.norm2 = RMSNorm(cfg.hidden), RMSNorm(cfg.hidden)
        self.q = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.k = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.v = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.out = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.mlp = MLP(cfg.hidden)

    def _heads(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.cfg.heads, self.cfg.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, ctx: Tensor, attention: AttentionCore, mask: object) -> Tensor:
        h = self.norm1(x)
        kv_in = torch.cat([ctx, h], dim=1)
        q, k, v = self._heads(self.q(h)), self._heads(self.k(kv_in)), self._heads(self.v(kv_in))
        att = attention(q, k, v, mask)
        b, _, s, _ = att.shape
        x = x + self.out(att.transpose(1, 2).reshape(b, s, -1))
        return x + self.mlp(self.norm2(x))


class Drafter(nn.Module):
    """The trainable part: fc + norm over target features, slot embeddings, draft layers, a final norm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden, cfg.hidden, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden)
        self.slot = nn.Embedding(cfg.block_size, cfg.hidden)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.draft_layers))
        self.norm = RMSNorm(cfg.hidden)

    def forward(
        self,
        features: Tensor,
        block_inputs: Tensor,
        target: TargetModel,
        attention: AttentionCore,
        mask: object,
    ) -> Tensor:
        """Logits for every block position: [B, K*bs, vocab+1]."""
        ctx = self.hidden_norm(self.fc(features))
        with torch.no_grad():
            x = target.embed(block_inputs)
        slots = (
            torch.arange(block_inputs.shape[1], device=block_inputs.device) % self.cfg.block_size
        )
        x = x + self.slot(slots)
        for layer in self.layers:
            x = layer(x, ctx, attention, mask)
        return target.lm_head(self.norm(x))


def flex_core(q: Tensor, k: Tensor, v: Tensor, mask: object) -> Tensor:
    """Attention through flex_attention with a BlockMask (compile this for the fused kernel)."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    assert isinstance(mask, BlockMask)
    return flex_attention(q, k, v, block_mask=mask)


def dense_core(q: Tensor, k: Tensor, v: Tensor, mask: object) -> Tensor:
    """Attention with a dense boolean mask derived from the same mask_mod (the CPU path)."""
    assert isinstance(mask, Tensor)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def loss_and_accuracy(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Mean cross-entropy over labelled positions, and the accuracy there."""
    flat_logits = logits.reshape(-1, logits.shape[-1]).float()
    flat_labels = labels.reshape(-1)
    loss = F.cross_entropy(flat_logits, flat_labels, ignore_index=-100)
    valid = flat_labels != -100
    acc = (flat_logits.argmax(-1)[valid] == flat_labels[valid]).float().mean()
    return loss, acc
