"""The inference protocol's gRPC service, on the protocol's published definition.

The service and its messages come from ``tritonclient.grpc`` (``service_pb2`` and
``service_pb2_grpc``: the KServe v2 ``GRPCInferenceService`` with Triton's additions), so
clients built on that definition work unchanged. Implemented: ServerLive, ServerReady,
ServerMetadata, ModelReady, ModelMetadata, ModelConfig, ModelStatistics, ModelInfer and
ModelStreamInfer (tritonclient's ``start_stream``/``async_stream_infer``: a result per chunk of a
streaming function, see ``gateway.v2.generation``); the rest (model repository, shared memory,
tracing, log settings) answer UNIMPLEMENTED with the reason. Keys travel as the ``authorization`` metadata, with
the same scopes as the REST routes. ModelInfer's tensors cross the wire without protobuf's copies
(``gateway.v2.grpc_wire``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

# The gateway may share its process with a worker that forks instance processes; gRPC's fork
# handlers are not needed there (children never use gRPC) and warn on every fork.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from dilu.keys import Need
from gateway.needs import GuardedModels
from gateway.v2.classification import class_count
from gateway.v2.generation import infer, stream_results
from gateway.v2.grpc_wire import InferRequest, InferResponse, add_to_server
from gateway.v2.inference import (
    EXTENSIONS,
    NO_SHARED_MEMORY,
    NOT_SERVED,
    SERVER_NAME,
    Inference,
    Model,
    ProtocolError,
    Result,
    find_model,
)
from gateway.v2.model_info import configuration, every_model_statistics, statistics
from gateway.v2.rest import VERSION
from gateway.v2.tensors import TensorError, check_header, element_count, from_binary, from_json, to_binary

log = logging.getLogger(__name__)

STREAM_REQUESTS = 64   # requests one ModelStreamInfer call may have running at once
FINAL = "triton_final_response"
EMPTY_FINAL = "triton_enable_empty_final_response"
STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED, 422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED, 502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# Which typed field of InferTensorContents carries each datatype (FP16 travels raw only).
CONTENT_FIELDS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def _from_contents(model: Model, tensor: Any) -> np.ndarray:
    spec = model.input(tensor.name)
    shape = check_header(spec, tensor.datatype, list(tensor.shape))
    field = CONTENT_FIELDS.get(spec.datatype)
    if field is None:
        raise TensorError(f"input {spec.name!r}: {spec.datatype} travels in raw_input_contents only")
    values = list(getattr(tensor.contents, field))
    if spec.datatype != "BYTES":
        return from_json(spec, shape, values)
    if len(values) != element_count(shape):
        raise TensorError(f"input {spec.name!r}: {len(values)} elements given, shape {shape} holds "
                          f"{element_count(shape)}")
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array.reshape(shape)


def decode(model: Model, request: InferRequest) -> Inference:
    """The inputs of a ModelInferRequest: all raw (in order) or all in typed contents."""
    message, raw = request.message, request.raw
    if raw and len(raw) != len(message.inputs):
        raise ProtocolError(400, f"raw_input_contents holds {len(raw)} tensors for {len(message.inputs)} inputs")
    if raw:
        typed = [tensor.name for tensor in message.inputs if tensor.HasField("contents")]
        if typed:
            raise ProtocolError(400, f"contents must not be specified for input {typed[0]!r} when the request uses "
                                     "raw_input_contents: all inputs raw, or all in typed contents")
    inputs: dict[str, np.ndarray] = {}
    try:
        for position, tensor in enumerate(message.inputs):
            if tensor.name in inputs:
                raise ProtocolError(400, f"input {tensor.name!r} is given twice")
            if raw:
                spec = model.input(tensor.name)
                inputs[tensor.name] = from_binary(spec, check_header(spec, tensor.datatype, list(tensor.shape)),
                                                  raw[position], finite=not model.spec.arrays)
            else:
                inputs[tensor.name] = _from_contents(model, tensor)
    except TensorError as exc:
        raise ProtocolError(400, str(exc)) from None
    wanted = [output.name for output in message.outputs] or None
    classify = {output.name: class_count(output.parameters["classification"].int64_param, output.name)
                for output in message.outputs if "classification" in output.parameters}
    return Inference(inputs=inputs, outputs=wanted, id=message.id or None, classify=classify)


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, services_of: Callable[[], GuardedModels]) -> None:
        self._services_of = services_of
        self.listening: tuple[str, int] | None = None    # (host, port), once bound

    async def _check(self, context: grpc.aio.ServicerContext, need: Need, model: str | None) -> None:
        services = self._services_of()
        if not services.auth.required:
            why = services.auth.instance_refusal(_peer_address(context.peer()), self.listening)
            if why is not None:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
        header = dict(context.invocation_metadata() or ()).get("authorization")
        denied = await services.auth.check(header, need, model)
        if denied is not None:
            await context.abort(STATUS_CODES[denied.status], denied.message)

    async def _model(self, context: grpc.aio.ServicerContext, need: Need, name: str, version: str) -> Model:
        await self._check(context, need, name)
        try:
            return await find_model(self._services_of(), name, version)
        except ProtocolError as exc:
            await context.abort(STATUS_CODES.get(exc.status, grpc.StatusCode.INTERNAL), exc.message)
            raise  # not reached: abort raises

    async def ServerLive(self, request: service_pb2.ServerLiveRequest,  # the protocol's names
                         context: grpc.aio.ServicerContext) -> service_pb2.ServerLiveResponse:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: service_pb2.ServerReadyRequest,
                          context: grpc.aio.ServicerContext) -> service_pb2.ServerReadyResponse:
        return service_pb2.ServerReadyResponse(ready=True)

    async def ServerMetadata(self, request: service_pb2.ServerMetadataRequest,
                             context: grpc.aio.ServicerContext) -> service_pb2.ServerMetadataResponse:
        return service_pb2.ServerMetadataResponse(name=SERVER_NAME, version=VERSION, extensions=EXTENSIONS)

    async def ModelReady(self, request: service_pb2.ModelReadyRequest,
                         context: grpc.aio.ServicerContext) -> service_pb2.ModelReadyResponse:
        model = await self._model(context, Need.MODEL, request.name, request.version)
        return service_pb2.ModelReadyResponse(ready=model.ready)

    async def ModelMetadata(self, request: service_pb2.ModelMetadataRequest,
                            context: grpc.aio.ServicerContext) -> service_pb2.ModelMetadataResponse:
        model = await self._model(context, Need.MODEL, request.name, request.version)
        meta = model.metadata()
        tensor = service_pb2.ModelMetadataResponse.TensorMetadata
        return service_pb2.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"],
            inputs=[tensor(**t) for t in meta["inputs"]], outputs=[tensor(**t) for t in meta["outputs"]])

    async def _no_shared_memory(self, request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NO_SHARED_MEMORY)

    SystemSharedMemoryStatus = SystemSharedMemoryRegister = SystemSharedMemoryUnregister = _no_shared_memory
    CudaSharedMemoryStatus = CudaSharedMemoryRegister = CudaSharedMemoryUnregister = _no_shared_memory

    async def _no_repository(self, request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NOT_SERVED["repository"])

    async def _no_trace(self, request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NOT_SERVED["trace"])

    async def _no_log_settings(self, request: object, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NOT_SERVED["logging"])

    RepositoryIndex = RepositoryModelLoad = RepositoryModelUnload = _no_repository
    TraceSetting = _no_trace
    LogSettings = _no_log_settings

    async def ModelConfig(self, request: service_pb2.ModelConfigRequest,
                          context: grpc.aio.ServicerContext) -> service_pb2.ModelConfigResponse:
        model = await self._model(context, Need.MODEL, request.name, request.version)
        return service_pb2.ModelConfigResponse(config=json_format.ParseDict(configuration(model),
                                                                            model_config_pb2.ModelConfig()))

    async def ModelStatistics(self, request: service_pb2.ModelStatisticsRequest,
                              context: grpc.aio.ServicerContext) -> service_pb2.ModelStatisticsResponse:
        services = self._services_of()
        if request.name:
            model = await self._model(context, Need.MODEL, request.name, request.version)
            found = statistics(model, services.invoker.stats.of(model.name), request.version or None)
        else:
            await self._check(context, Need.READ, None)
            found = await every_model_statistics(services)
        return json_format.ParseDict({"model_stats": found}, service_pb2.ModelStatisticsResponse())

    async def ModelInfer(self, request: InferRequest, context: grpc.aio.ServicerContext) -> InferResponse:
        if request.error is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)
        message = request.message
        model = await self._model(context, Need.INVOKE, message.model_name, message.model_version)
        try:
            result = await infer(self._services_of(), model, decode(model, request))
        except ProtocolError as exc:
            await context.abort(STATUS_CODES.get(exc.status, grpc.StatusCode.INTERNAL), exc.message)
        return _response(result)

    async def ModelStreamInfer(self, requests: AsyncIterator[InferRequest],
                               context: grpc.aio.ServicerContext
                               ) -> AsyncIterator[service_pb2.ModelStreamInferResponse]:
        """Each request's results as they come (requests run side by side, their results
        interleaved and told apart by ``id``); a request's failure is an in-band error message,
        and the stream goes on. A key that may not use a model ends the stream."""
        answers: asyncio.Queue[service_pb2.ModelStreamInferResponse | None] = asyncio.Queue(maxsize=256)
        running: set[asyncio.Task[None]] = set()
        slots = asyncio.Semaphore(STREAM_REQUESTS)

        async def read() -> None:
            try:
                async for request in requests:
                    await self._check(context, Need.INVOKE, request.message.model_name)
                    await slots.acquire()
                    task = asyncio.create_task(self._stream_one(request, answers))
                    running.add(task)
                    task.add_done_callback(lambda done: (running.discard(done), slots.release()))
                while running:
                    await asyncio.gather(*running, return_exceptions=True)
            finally:
                await answers.put(None)

        reader = asyncio.create_task(read())
        try:
            while (answer := await answers.get()) is not None:
                yield answer
            await reader   # a refused key ends the stream with the reader's abort
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()   # the caller left: each relay closes, each generation stops
            with contextlib.suppress(BaseException):
                await reader

    async def _stream_one(self, request: InferRequest,
                          answers: asyncio.Queue[service_pb2.ModelStreamInferResponse | None]) -> None:
        services, message = self._services_of(), request.message
        try:
            if request.error is not None:
                raise ProtocolError(400, request.error)
            model = await find_model(services, message.model_name, message.model_version)
            async for result in stream_results(services, model, decode(model, request)):
                await answers.put(service_pb2.ModelStreamInferResponse(infer_response=_whole(_response(result, False))))
        except ProtocolError as exc:
            await answers.put(service_pb2.ModelStreamInferResponse(
                error_message=exc.message, infer_response=service_pb2.ModelInferResponse(
                    model_name=message.model_name, id=message.id)))
            return
        if message.parameters[EMPTY_FINAL].bool_param if EMPTY_FINAL in message.parameters else False:
            final = service_pb2.ModelInferResponse(model_name=model.name, model_version=model.version, id=message.id)
            final.parameters[FINAL].bool_param = True
            await answers.put(service_pb2.ModelStreamInferResponse(infer_response=final))


def _response(result: Result, final: bool | None = None) -> InferResponse:
    """A result as the protocol's response; ``final`` marks (or not) the last of a stream's."""
    model = result.model
    response = InferResponse(service_pb2.ModelInferResponse(model_name=model.name, model_version=model.version,
                                                            id=result.id or ""))
    for spec, array in result.outputs:
        response.message.outputs.add(name=spec.name, datatype=spec.datatype, shape=list(array.shape))
        response.raw.append(to_binary(spec, array))
    if final is not None:
        response.message.parameters[FINAL].bool_param = final
    return response


def _whole(response: InferResponse) -> service_pb2.ModelInferResponse:
    """The response as one message, to nest in a stream's."""
    response.message.raw_output_contents.extend(bytes(blob) for blob in response.raw)
    return response.message


def _peer_address(peer: str) -> tuple[str, int] | None:
    """("127.0.0.1", 5555) from gRPC's "ipv4:127.0.0.1:5555" (or "ipv6:[::1]:5555")."""
    kind, _, rest = peer.partition(":")
    host, _, port = rest.rpartition(":")
    if kind not in ("ipv4", "ipv6") or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


async def start_grpc(host: str, port: int, services_of: Callable[[], GuardedModels],
                     max_message_bytes: int) -> tuple[grpc.aio.Server, int]:
    """A started gRPC server on ``host:port`` (0: a free port) and the port it took."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", max_message_bytes),
                                      ("grpc.max_send_message_length", -1),
                                      ("grpc.so_reuseport", 0)])
    servicer = InferenceService(services_of)
    add_to_server(servicer, server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {address} for gRPC: {exc}") from None
    if bound == 0:
        raise OSError(f"cannot listen on {address} for gRPC (is the port taken?)")
    servicer.listening = (host, bound)
    await server.start()
    return server, bound
