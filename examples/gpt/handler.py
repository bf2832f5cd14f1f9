"""A small GPT-style generator built in code: byte-level tokens, causal attention, greedy decoding.

Input: {"prompt": str, "max_new_tokens": int (default 16, at most 64)}. Output: the generated
token ids and their bytes decoded as text (random weights, so the text is not meaningful).
"""

import torch
from torch import nn

from dilu import Handler

VOCAB = 256  # one token per byte


class TinyGpt(nn.Module):
    def __init__(self, dim: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.context = context
        self.tokens = nn.Embedding(VOCAB, dim)
        self.positions = nn.Embedding(context, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 4, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        positions = torch.arange(length, device=ids.device).unsqueeze(0)
        causal = nn.Transformer.generate_square_subsequent_mask(length, device=ids.device)
        hidden = self.blocks(self.tokens(ids) + self.positions(positions), mask=causal, is_causal=True)
        return self.head(self.norm(hidden))

    @torch.inference_mode()
    def generate(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        ids = torch.tensor([prompt or [0]], device=self.head.weight.device)
        generated = []
        for _ in range(max_new_tokens):
            logits = self(ids[:, -self.context:])
            next_id = int(logits[0, -1].argmax())
            generated.append(next_id)
            ids = torch.cat([ids, torch.tensor([[next_id]], device=ids.device)], dim=1)
        return generated


class GptGenerator(Handler):
    def load(self) -> None:
        torch.manual_seed(int(self.options.get("seed", 0)))
        torch.set_num_threads(int(self.options.get("threads", 1)))
        self.max_new_tokens = int(self.options.get("max_new_tokens", 64))
        self.model = TinyGpt(int(self.options.get("dim", 64)), int(self.options.get("layers", 2)),
                             int(self.options.get("heads", 4)), int(self.options.get("context", 128)))
        self.model.to(self.device).eval()

    def predict(self, inputs: list) -> list:
        results = []
        for item in inputs:
            if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
                raise ValueError('each input must be {"prompt": "...", "max_new_tokens": n}')
            count = int(item.get("max_new_tokens", 16))
            if not 1 <= count <= self.max_new_tokens:
                raise ValueError(f"max_new_tokens must be between 1 and {self.max_new_tokens}")
            tokens = self.model.generate(list(item["prompt"].encode("utf-8")), count)
            results.append({"tokens": tokens, "text": bytes(tokens).decode("utf-8", errors="replace")})
        return results
