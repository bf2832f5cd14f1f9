"""The bench's row-sum model on KServe's Python model server (the `kserve` package): the same
numpy sum as Dilu's handler, served over the v2 protocol (REST, binary extension included, and
gRPC). Run by bench/tensors.py in its own virtual environment:

    python kserve_rowsums.py --http_port P --grpc_port Q
"""

from __future__ import annotations

from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer


class RowSums(Model):
    def __init__(self) -> None:
        super().__init__("rowsums")
        self.ready = True

    async def predict(self, payload: InferRequest, headers: dict | None = None,
                      response_headers: dict | None = None) -> InferResponse:
        sums = payload.inputs[0].as_numpy().sum(axis=1)
        asked = payload.request_outputs or []
        binary = bool(asked and asked[0].binary_data) or payload.use_binary_outputs
        output = InferOutput(name="sums", shape=list(sums.shape), datatype="FP32")
        output.set_data_from_numpy(sums, binary_data=binary)
        return InferResponse(model_name=self.name, infer_outputs=[output], response_id=payload.id or "")


if __name__ == "__main__":
    ModelServer().start([RowSums()])
