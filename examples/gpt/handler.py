"""A small GPT-style generator built in code: byte-level tokens, causal attention.

Input: {"prompt": str, "max_new_tokens": int (default: as many as its context leaves, at most 64),
"temperature", "top_p", "seed", "presence_penalty", "frequency_penalty"}: greedy decoding unless
a temperature above 0 asks for sampling. It streams: asked with ``Accept: text/event-stream`` it
sends each token as it is made ({"token", "text"}; the last also carries "usage", the prompt's
and the completion's tokens); a plain request gets the generated token ids and their bytes
decoded as text (random weights, so the text is not meaningful). Requests that arrive
mid-generation join the batch at the next token.
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
    def next_logits(self, sequences: list[list[int]]) -> torch.Tensor:
        """The logits of each sequence's next token, in one forward pass over the batch. Sequences
        are right-padded: under the causal mask a real token never attends to the padding."""
        window = [sequence[-self.context:] or [0] for sequence in sequences]
        longest = max(len(sequence) for sequence in window)
        ids = torch.zeros((len(window), longest), dtype=torch.long, device=self.head.weight.device)
        for row, sequence in enumerate(window):
            ids[row, :len(sequence)] = torch.tensor(sequence)
        last = torch.tensor([len(sequence) - 1 for sequence in window], device=ids.device)
        return self(ids)[torch.arange(len(window), device=ids.device), last].float().cpu()


def _option(request: dict, name: str, default: float, low: float, high: float) -> float:
    value = request.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise InputError(f"{name} must be a number from {low:g} to {high:g}")
    return float(value)


def choose(logits: torch.Tensor, state: dict) -> int:
    """The next token: the penalties applied, then greedy at temperature 0, else sampled from the
    top_p nucleus with the request's own generator (its seed)."""
    logits = logits.clone()
    produced = state["sequence"][state["prompt_tokens"]:]
    if produced and (state["presence"] or state["frequency"]):
        counts = torch.bincount(torch.tensor(produced), minlength=VOCAB).float()
        logits -= state["frequency"] * counts + state["presence"] * (counts > 0).float()
    if state["temperature"] == 0:
        return int(logits.argmax())
    probabilities = torch.softmax(logits / state["temperature"], dim=-1)
    ordered, order = probabilities.sort(descending=True)
    keep = (ordered.cumsum(0) - ordered) < state["top_p"]      # the smallest set reaching top_p
    ordered = ordered * keep
    pick = torch.multinomial(ordered / ordered.sum(), 1, generator=state["generator"])
    return int(order[pick])


class GptGenerator(Handler):
    def load(self) -> None:
        torch.manual_seed(int(self.options.get("seed", 0)))
        torch.set_num_threads(int(self.options.get("threads", 1)))
        self.max_new_tokens = int(self.options.get("max_new_tokens", 64))
        self.model = TinyGpt(int(self.options.get("dim", 64)), int(self.options.get("layers", 2)),
                             int(self.options.get("heads", 4)), int(self.options.get("context", 128)))
        self.model.to(self.device).eval()

    def start(self, request: dict) -> dict:
        """A request joins the running batch: its prompt, how many tokens it wants, how to pick them."""
        if not isinstance(request, dict) or not isinstance(request.get("prompt"), str):
            raise InputError('each input must be {"prompt": "...", "max_new_tokens": n}')
        sequence = list(request["prompt"].encode("utf-8"))
        room = self.model.context - len(sequence)
        count = request.get("max_new_tokens")
        if count is None:           # as many as the context leaves, within the generator's own bound
            count = min(self.max_new_tokens, room)
            if count < 1:
                raise InputError(f"the prompt is {len(sequence)} tokens: it fills the model's context of "
                                 f"{self.model.context} tokens")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= self.max_new_tokens:
            raise InputError(f"max_new_tokens must be a whole number between 1 and {self.max_new_tokens}")
        if count > room:
            raise InputError(f"the prompt is {len(sequence)} tokens; with max_new_tokens {count} that passes the "
                             f"model's context of {self.model.context} tokens")
        seed = request.get("seed")
        generator = torch.Generator()
        generator.manual_seed(seed if isinstance(seed, int) and not isinstance(seed, bool) else 0)
        return {"sequence": sequence, "left": count, "prompt_tokens": len(sequence), "generator": generator,
                "temperature": _option(request, "temperature", 0.0, 0, 2),
                "top_p": _option(request, "top_p", 1.0, 1e-6, 1),
                "presence": _option(request, "presence_penalty", 0.0, -2, 2),
                "frequency": _option(request, "frequency_penalty", 0.0, -2, 2)}

    def step(self, states: list[dict]) -> list:
        """One token for every running request, in one forward pass; a request's last is Last,
        with its usage."""
        chunks = []
        logits = self.model.next_logits([s["sequence"] for s in states])
        for state, row in zip(states, logits, strict=True):
            token = choose(row, state)
            state["sequence"].append(token)
            state["left"] -= 1
            chunk = {"token": token, "text": bytes([token]).decode("utf-8", errors="replace")}
            if state["left"] == 0:
                made = len(state["sequence"]) - state["prompt_tokens"]
                chunk["usage"] = {"prompt_tokens": state["prompt_tokens"], "completion_tokens": made}
                chunk = Last(chunk)
            chunks.append(chunk)
        return chunks

    def finish(self, chunks: list[dict]) -> dict:
        """A plain (not streamed) request's answer: every token, and their bytes as text."""
        tokens = [chunk["token"] for chunk in chunks]
        return {"tokens": tokens, "text": bytes(tokens).decode("utf-8", errors="replace")}
