"""Redis state store and event bus: all Redis calls live here."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import redis.asyncio as aioredis

from dilu.fencing import Deposed
from dilu.messages import Endpoint, FunctionActivity, WorkerInfo
from dilu.state.base import REQUEST_HISTORY_S, Channel, merge_activity

# Writes one function's routes unless a newer term has written routes (KEYS: the routes hash, the
# term's key; ARGV: function, term, the endpoints' JSON or "" to remove). Returns the newest term.
_FENCED_ROUTES = """
local newest = tonumber(redis.call('get', KEYS[2]) or '0')
local term = tonumber(ARGV[2])
if term < newest then return newest end
if term > newest then redis.call('set', KEYS[2], ARGV[2]) end
if ARGV[3] == '' then redis.call('hdel', KEYS[1], ARGV[1]) else redis.call('hset', KEYS[1], ARGV[1], ARGV[3]) end
return term
"""


class RedisStore:
    """Implements StateStore on Redis; every key and channel starts with ``prefix``."""

    def __init__(self, url: str, prefix: str = "dilu:") -> None:
        self._redis = aioredis.Redis.from_url(url, decode_responses=True)
        self._prefix = prefix
        self._fenced_routes = self._redis.register_script(_FENCED_ROUTES)

    def _key(self, *parts: str) -> str:
        return self._prefix + ":".join(parts)

    async def ping(self) -> None:
        await self._redis.ping()

    async def heartbeat(self, info: WorkerInfo, ttl_s: float) -> None:
        await self._redis.set(self._key("worker", info.id), json.dumps(info.to_dict()), px=int(ttl_s * 1000))

    async def live_workers(self) -> list[WorkerInfo]:
        keys = [key async for key in self._redis.scan_iter(match=self._key("worker", "*"), count=500)]
        if not keys:
            return []
        values = await self._redis.mget(keys)
        return [WorkerInfo.from_dict(json.loads(value)) for value in values if value]

    async def report_activity(self, gateway_id: str, snapshot: dict[str, dict[str, Any]],
                              counts: dict[str, dict[int, int]], ttl_s: float) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(self._key("activity", gateway_id), json.dumps(snapshot), px=int(ttl_s * 1000))
            for name, per_second in counts.items():
                key = self._key("requests", name)
                for second, count in per_second.items():
                    pipe.hincrby(key, str(second), count)
                pipe.expire(key, REQUEST_HISTORY_S)
            await pipe.execute()

    async def function_activity(self) -> dict[str, FunctionActivity]:
        snapshot_keys = [k async for k in self._redis.scan_iter(match=self._key("activity", "*"), count=500)]
        snapshots = [json.loads(v) for v in (await self._redis.mget(snapshot_keys) if snapshot_keys else []) if v]
        counts: dict[str, dict[int, int]] = {}
        horizon = int(time.time()) - REQUEST_HISTORY_S
        prefix = self._key("requests", "")
        async for key in self._redis.scan_iter(match=prefix + "*", count=500):
            raw = await self._redis.hgetall(key)
            stale = [second for second in raw if int(second) < horizon]
            if stale:
                await self._redis.hdel(key, *stale)
            counts[key[len(prefix):]] = {int(s): int(c) for s, c in raw.items() if int(s) >= horizon}
        return merge_activity(snapshots, counts)

    async def report_telemetry(self, worker_id: str, instances: dict[str, dict[str, Any]], ttl_s: float) -> None:
        await self._redis.set(self._key("telemetry", worker_id), json.dumps(instances), px=int(ttl_s * 1000))

    async def telemetry(self) -> dict[str, dict[str, Any]]:
        keys = [k async for k in self._redis.scan_iter(match=self._key("telemetry", "*"), count=500)]
        merged: dict[str, dict[str, Any]] = {}
        for value in (await self._redis.mget(keys) if keys else []):
            if value:
                merged.update(json.loads(value))
        return merged

    async def set_routes(self, function: str, endpoints: list[Endpoint], term: int | None = None) -> None:
        key = self._key("routes")
        value = json.dumps([e.to_dict() for e in endpoints]) if endpoints else ""
        if term is not None:
            newest = int(await self._fenced_routes(keys=[key, self._key("routes-term")], args=[function, term, value]))
            if newest != term:
                raise Deposed(term, newest)
        elif value:
            await self._redis.hset(key, function, value)
        else:
            await self._redis.hdel(key, function)

    async def append_history(self, key: str, item: dict[str, Any], keep: int, ttl_s: float) -> None:
        name = self._key("history", key)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.rpush(name, json.dumps(item))
            pipe.ltrim(name, -keep, -1)
            pipe.pexpire(name, int(ttl_s * 1000))
            await pipe.execute()

    async def histories(self, keys: list[str]) -> dict[str, list[dict[str, Any]]]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.lrange(self._key("history", key), 0, -1)
            lists = await pipe.execute()
        return {key: [json.loads(item) for item in items] for key, items in zip(keys, lists, strict=True)}

    async def get_routes(self) -> dict[str, list[Endpoint]]:
        raw = await self._redis.hgetall(self._key("routes"))
        return {name: [Endpoint(**item) for item in json.loads(value)] for name, value in raw.items()}

    async def publish(self, channel: Channel, message: dict[str, Any]) -> None:
        await self._redis.publish(self._key("events", channel.value), json.dumps(message))

    async def subscribe(self, channel: Channel) -> _RedisSubscription:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe(self._key("events", channel.value))
        return _RedisSubscription(pubsub)

    async def close(self) -> None:
        await self._redis.aclose()


class _RedisSubscription:
    def __init__(self, pubsub: aioredis.client.PubSub) -> None:
        self._pubsub = pubsub

    async def get(self, timeout: float) -> dict[str, Any] | None:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return None
            message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
            if message and message.get("type") == "message":
                return json.loads(message["data"])

    async def aclose(self) -> None:
        await self._pubsub.aclose()
