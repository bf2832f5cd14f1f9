"""The sum and difference of two tensors (Triton's ``simple``); a batch arrives stacked."""


class Simple:
    def predict(self, batch):
        first, second = batch["INPUT0"], batch["INPUT1"]
        return {"OUTPUT0": first + second, "OUTPUT1": first - second}
