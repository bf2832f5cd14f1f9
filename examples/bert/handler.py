"""A BERT-style text encoder built in code, with a simple hashing word tokenizer.

Input: {"text": str}. Output: a sentence embedding (mean-pooled, L2-normalised) and its token count.
"""

import re
import zlib

import torch
from torch import nn

from dilu import Handler

CLS, SEP, PAD = 1, 2, 0
RESERVED = 3


class SimpleTokenizer:
    """Lower-cases, splits into words and punctuation, and hashes each piece into the vocabulary."""

    def __init__(self, vocab_size: int, max_length: int) -> None:
        self.vocab_size, self.max_length = vocab_size, max_length

    def encode(self, text: str) -> list[int]:
        pieces = re.findall(r"[a-z0-9]+|[^\sa-z0-9]", text.lower())
        ids = [RESERVED + zlib.crc32(p.encode()) % (self.vocab_size - RESERVED) for p in pieces]
        return [CLS] + ids[: self.max_length - 2] + [SEP]


class TextEncoder(nn.Module):
    def __init__(self, vocab_size: int, dim: int, layers: int, heads: int, max_length: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, dim, padding_idx=PAD)
        self.positions = nn.Embedding(max_length, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 4, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        hidden = self.encoder(self.tokens(ids) + self.positions(positions), src_key_padding_mask=~mask)
        hidden = self.norm(hidden) * mask.unsqueeze(-1)
        pooled = hidden.sum(1) / mask.sum(1, keepdim=True)
        return nn.functional.normalize(pooled, dim=-1)


class BertEncoder(Handler):
    def load(self) -> None:
        torch.manual_seed(int(self.options.get("seed", 0)))
        torch.set_num_threads(int(self.options.get("threads", 1)))
        vocab, self.max_length = int(self.options.get("vocab_size", 8192)), int(self.options.get("max_length", 128))
        self.tokenizer = SimpleTokenizer(vocab, self.max_length)
        self.model = TextEncoder(vocab, int(self.options.get("dim", 64)), int(self.options.get("layers", 2)),
                                 int(self.options.get("heads", 4)), self.max_length).to(self.device).eval()

    def predict(self, inputs: list) -> list:
        encoded = []
        for item in inputs:
            if not isinstance(item, dict) or not isinstance(item.get("text"), str):
                raise ValueError('each input must be {"text": "..."}')
            encoded.append(self.tokenizer.encode(item["text"]))
        width = max(len(ids) for ids in encoded)
        ids = torch.tensor([row + [PAD] * (width - len(row)) for row in encoded], device=self.device)
        with torch.inference_mode():
            embeddings = self.model(ids, ids != PAD).cpu()
        return [{"embedding": [round(float(v), 6) for v in vector], "tokens": len(row)}
                for vector, row in zip(embeddings, encoded, strict=True)]
