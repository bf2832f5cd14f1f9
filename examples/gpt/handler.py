"""A small GPT-style generator built in code: byte-level tokens, causal attention, greedy decoding.

Input: {"prompt": str, "max_new_tokens": int (default 16, at most 64)}. It streams: asked with
``Accept: text/event-stream`` it sends each token as it is made ({"token", "text"}); a plain
request gets the generated token ids and their bytes decoded as text (random weights, so the
text is not meaningful). Requests that arrive mid-generation join the batch at the next token.
"""

import torch
from torch import nn

from dilu import Handler, InputError, Last

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
    def next_tokens(self, sequences: list[list[int]]) -> list[int]:
        """The greedy next token of each sequence, in one forward pass over the batch. Sequences
        are right-padded: under the causal mask a real token never attends to the padding."""
        window = [sequence[-self.context:] or [0] for sequence in sequences]
        longest = max(len(sequence) for sequence in window)
        ids = torch.zeros((len(window), longest), dtype=torch.long, device=self.head.weight.device)
        for row, sequence in enumerate(window):
            ids[row, :len(sequence)] = torch.tensor(sequence)
        last = torch.tensor([len(sequence) - 1 for sequence in window], device=ids.device)
        logits = self(ids)[torch.arange(len(window), device=ids.device), last]
        return logits.argmax(dim=-1).tolist()


class GptGenerator(Handler):
    def load(self) -> None:
        torch.manual_seed(int(self.options.get("seed", 0)))
        torch.set_num_threads(int(self.options.get("threads", 1)))
        self.max_new_tokens = int(self.options.get("max_new_tokens", 64))
        self.model = TinyGpt(int(self.options.get("dim", 64)), int(self.options.get("layers", 2)),
                             int(self.options.get("heads", 4)), int(self.options.get("context", 128)))
        self.model.to(self.device).eval()

    def start(self, request: dict) -> dict:
        """A request joins the running batch: its prompt and how many tokens it wants."""
        if not isinstance(request, dict) or not isinstance(request.get("prompt"), str):
            raise InputError('each input must be {"prompt": "...", "max_new_tokens": n}')
        count = request.get("max_new_tokens", 16)
        if not isinstance(count, int) or not 1 <= count <= self.max_new_tokens:
            raise InputError(f"max_new_tokens must be a whole number between 1 and {self.max_new_tokens}")
        sequence = list(request["prompt"].encode("utf-8"))
        if len(sequence) + count > self.model.context:
            raise InputError(f"the prompt is {len(sequence)} tokens; with max_new_tokens {count} that passes the "
                             f"model's context of {self.model.context} tokens")
        return {"sequence": sequence, "left": count}

    def step(self, states: list[dict]) -> list:
        """One token for every running request, in one forward pass; a request's last is Last."""
        chunks = []
        for state, token in zip(states, self.model.next_tokens([s["sequence"] for s in states]), strict=True):
            state["sequence"].append(token)
            state["left"] -= 1
            chunk = {"token": token, "text": bytes([token]).decode("utf-8", errors="replace")}
            chunks.append(Last(chunk) if state["left"] == 0 else chunk)
        return chunks

    def finish(self, chunks: list[dict]) -> dict:
        """A plain (not streamed) request's answer: every token, and their bytes as text."""
        tokens = [chunk["token"] for chunk in chunks]
        return {"tokens": tokens, "text": bytes(tokens).decode("utf-8", errors="replace")}
