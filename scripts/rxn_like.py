"""An rxnmapper-like encoder for issue #20's LayerNormalization numbers (torch, CPU).

rxnmapper is an ALBERT encoder over reaction SMILES tokens: factorised embeddings (128 -> 256),
one transformer layer shared by 12 repetitions, post-norm, GELU feed-forward, and opset-17
LayerNormalization when exported. This module has that shape with seeded random weights,
scaled so the residual stream reaches the tens, as a trained model's does:

    trtbisect export scripts/rxn_like.py:rxn_like -o rxn_like.onnx --opset 17
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB, EMBED, HIDDEN, HEADS, FFN, LAYERS, SEQ = 600, 128, 256, 4, 1024, 12, 96


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.out = nn.Linear(HIDDEN, HIDDEN)
        self.ln1 = nn.LayerNorm(HIDDEN, eps=1e-12)
        self.ff1 = nn.Linear(HIDDEN, FFN)
        self.ff2 = nn.Linear(FFN, HIDDEN)
        self.ln2 = nn.LayerNorm(HIDDEN, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, HIDDEN // HEADS).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / (HIDDEN // HEADS) ** 0.5, dim=-1)
        ctx = (att @ v).transpose(1, 2).reshape(b, s, HIDDEN)
        x = self.ln1(x + self.out(ctx))
        return self.ln2(x + self.ff2(nn.functional.gelu(self.ff1(x))))


class RxnLike(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.words = nn.Embedding(VOCAB, EMBED)
        self.positions = nn.Embedding(SEQ, EMBED)
        self.ln = nn.LayerNorm(EMBED, eps=1e-12)
        self.project = nn.Linear(EMBED, HIDDEN)
        self.layer = Layer()  # ALBERT shares one layer across the depth

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1]).unsqueeze(0)
        x = self.project(self.ln(self.words(input_ids) + self.positions(pos)))
        for _ in range(LAYERS):
            x = self.layer(x)
        return x


def rxn_like():
    """The module with seeded weights and one tokenised-reaction-like sample."""
    torch.manual_seed(0)
    model = RxnLike().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight") and p.dim() == 2 and "words" not in name:
                p.mul_(4.0)  # residual stream in the tens, as in a trained encoder
            if "ln" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.5 * torch.randn_like(p))
            if "ln" in name and name.endswith("bias"):
                p.copy_(0.5 * torch.randn_like(p))
    ids = torch.randint(5, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(1))
    ids[0, 0], ids[0, -1] = 2, 3  # [CLS], [SEP]
    return model, (ids,)
