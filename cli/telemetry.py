"""`dilu describe`: the lines under the instance table that say why GRANTED and USED differ,
where they do for a reason the numbers alone do not show (docs/cli.md#dilu-describe)."""

from __future__ import annotations

from typing import Any

PAST_LIMIT = 0.02     # shares are sampled: a latency instance this far past its limit is not noise
BELOW_GRANT = 0.05    # and a held batch instance this far below its grant


def telemetry_notes(function_class: str, instances: list[dict[str, Any]]) -> list[str]:
    """One line per instance whose use departs from its grant by design: a latency instance
    serving requests is never held to its share, and a batch instance beside latency work is
    held while that work runs (with a floor of 10 % of the device)."""
    notes = []
    for instance in instances:
        view = instance.get("telemetry") or {}
        used, granted, limit = view.get("used_share"), view.get("granted_share"), instance.get("sm_limit")
        if used is None or granted is None:
            continue
        if function_class == "latency" and limit is not None and used > limit + PAST_LIMIT:
            notes.append(f"{instance['id']} used {used:.2f}, past its limit {limit:g}: a latency instance "
                         "serving requests never waits for tokens; its share bounds it between requests")
        elif function_class == "batch" and view.get("held_ms") and used < granted - BELOW_GRANT:
            notes.append(f"{instance['id']} used {used:.2f} of the {granted:.2f} granted: its launches wait "
                         "while latency work on its GPU runs (HELD, in all), with a floor of 10 % of the device")
    return notes
