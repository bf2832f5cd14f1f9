"""The bench's row-sum model as an MLServer custom runtime: the same numpy sum as Dilu's
handler, over the v2 protocol (REST JSON and gRPC; MLServer's REST has no binary extension).
bench/tensors.py writes the settings and runs ``mlserver start`` in its own environment."""

from __future__ import annotations

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class RowSums(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        sums = NumpyCodec.decode_input(payload.inputs[0]).sum(axis=1)
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output("sums", sums)])
