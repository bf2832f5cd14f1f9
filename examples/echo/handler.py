"""A no-op function: returns each input unchanged (used for smoke tests and the gateway benchmark)."""


class Echo:
    def __init__(self, **options):
        self.options = options

    def load(self):
        pass

    def predict(self, inputs):
        return list(inputs)
