"""The gateway's relay of a stream: whatever the instance does, the caller's stream ends with its
terminator or an error frame it can parse, never as if it had finished."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from dilu.instance_protocol import stream_ending
from gateway.forward import InstanceFailed, InstanceTimeout, Streamed
from gateway.streams import Relay, StreamError

SSE, NDJSON = "text/event-stream", "application/x-ndjson"


def _relay(content_type: str, pieces: list[bytes], then: Exception | None = None, max_s: float = 60.0,
           ended: list[bool] | None = None) -> Relay:
    """A relay over an instance's answer that sends ``pieces`` and then ends (or raises ``then``)."""

    async def chunks(idle_s: float, deadline: float) -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece
        if then is not None:
            raise then

    streamed = Streamed(200, content_type, {}, chunks, lambda: None)
    return Relay("f", streamed, 2.0, max_s, lambda: (ended if ended is not None else []).append(True), 0.0)


async def _read(relay: Relay) -> bytes:
    return b"".join([piece async for piece in relay.pieces()])


async def test_a_finished_stream_passes_through_whole() -> None:
    sse = [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]
    assert await _read(_relay(SSE, sse)) == b"".join(sse)
    lines = [b'{"n": 1}\n{"n"', b': 2}\n', b'{"done": true, "chunks": 2}\n']
    assert await _read(_relay(NDJSON, lines)) == b"".join(lines)


async def test_an_instance_lost_mid_stream_ends_it_with_an_error_frame_after_whole_frames() -> None:
    ended: list[bool] = []
    body = await _read(_relay(SSE, [b"data: 1\n\n", b"data: {\"half"], InstanceFailed("connection reset"),
                              ended=ended))
    first, error = body.split(b"\n\n")[:2]
    assert first == b"data: 1" and error.startswith(b"event: error\ndata: ")
    failure = json.loads(error.split(b"data: ", 1)[1])
    assert failure["status"] == 502 and "connection reset" in failure["error"] and ended == [True]
    lines = (await _read(_relay(NDJSON, [b'{"n": 1}\n{"n": 2', b"}\n{\"n\""], InstanceFailed("gone")))).splitlines()
    assert [json.loads(line) for line in lines[:-1]] == [{"n": 1}, {"n": 2}]
    assert stream_ending(lines[-1]) == "error" and json.loads(lines[-1])["status"] == 502


@pytest.mark.parametrize(("max_s", "words"), [(60.0, "sent nothing for 2 s"), (0.0, "past its limit of 0 s")])
async def test_a_silent_or_overlong_stream_ends_with_a_504_frame(max_s: float, words: str) -> None:
    lines = (await _read(_relay(NDJSON, [b"1\n"], InstanceTimeout("quiet"), max_s=max_s))).splitlines()
    failure = json.loads(lines[-1])
    assert lines[0] == b"1" and failure["status"] == 504 and words in failure["error"]


async def test_a_stream_the_instance_closes_without_its_terminator_is_cut() -> None:
    for content_type, pieces in ((SSE, [b"data: 1\n\n"]), (NDJSON, [b"1\n2"])):
        body = await _read(_relay(content_type, pieces))
        assert b"without its last frame" in body and b'"status": 502' in body


async def test_json_lines_stop_at_done_and_raise_the_error_line() -> None:
    done = _relay(NDJSON, [b'{"n": 1}\n{"done": true, "chunks": 1}\n'])
    assert [chunk async for chunk in done.json_lines()] == [{"n": 1}]
    chunks = []
    with pytest.raises(StreamError) as caught:
        async for chunk in _relay(NDJSON, [b'{"n": 1}\n'], InstanceFailed("reset")).json_lines():
            chunks.append(chunk)
    assert chunks == [{"n": 1}] and caught.value.status == 502 and "stream cut" in caught.value.message
    # A chunk that merely looks like a terminator (another key beside) is a chunk.
    lookalike = _relay(NDJSON, [b'{"done": true, "chunks": 1, "n": 3}\n{"done": true, "chunks": 1}\n'])
    assert [chunk async for chunk in lookalike.json_lines()] == [{"done": True, "chunks": 1, "n": 3}]
