"""Triton's ``repeat_int32`` as a streaming handler: each step answers every running request's
next element, after the longest of their next delays."""

import time

from dilu import InputError, Last

MAX_DELAY_MS = 60_000


class Repeat:
    def start(self, request):
        values, delays = request["IN"], request["DELAY"]
        if not values:
            raise InputError("IN is empty: nothing to repeat")
        if len(delays) != len(values):
            raise InputError(f"DELAY holds {len(delays)} elements for the {len(values)} of IN: one delay each")
        if any(delay > MAX_DELAY_MS for delay in delays):
            raise InputError(f"a DELAY above {MAX_DELAY_MS} ms")
        return {"values": values, "delays": delays, "at": 0}

    def step(self, states):
        time.sleep(max(state["delays"][state["at"]] for state in states) / 1000)
        chunks = []
        for state in states:
            at = state["at"]
            chunk = {"OUT": [state["values"][at]], "IDX": [at]}
            state["at"] = at + 1
            chunks.append(Last(chunk) if state["at"] == len(state["values"]) else chunk)
        return chunks
