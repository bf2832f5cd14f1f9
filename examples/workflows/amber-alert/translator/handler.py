"""Renders the alert in another language: a tiny sequence model (embedding + GRU) over the
alert's words, each output word drawn from the target language's small vocabulary (weights from
a fixed seed: a stand-in for a real translation model, with the same shape of work)."""

import torch

from dilu import Handler

VOCABULARY = {
    "es": ("alerta", "persona", "vista", "de", "pie", "caminando", "sentada", "corriendo"),
    "fr": ("alerte", "personne", "vue", "debout", "marchant", "assise", "courant", "identifiant"),
    "de": ("Alarm", "Person", "gesehen", "stehend", "gehend", "sitzend", "laufend", "Kennung"),
}


class Translator(Handler):
    def load(self):
        torch.manual_seed(4)
        self.embed = torch.nn.Embedding(512, 32)
        self.rnn = torch.nn.GRU(32, 64, batch_first=True)
        self.out = torch.nn.Linear(64, 8)

    def predict(self, inputs):
        results = []
        for item in inputs:
            words = item["alert"].split()
            ids = torch.tensor([[sum(map(ord, w)) % 512 for w in words]])
            with torch.inference_mode():
                states, _ = self.rnn(self.embed(ids))
                picks = self.out(states[0]).argmax(dim=1)
            vocabulary = VOCABULARY.get(item["language"], VOCABULARY["es"])
            results.append({"alert": " ".join(vocabulary[int(k)] for k in picks), "language": item["language"],
                            "original": item["alert"]})
        return results
