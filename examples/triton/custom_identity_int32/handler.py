"""Its input, unchanged (Triton's identity models)."""


class Identity:
    def predict(self, batch):
        return {"OUTPUT0": batch["INPUT0"]}
