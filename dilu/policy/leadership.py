"""When a controller renews, retries and gives up its lease (pure: times are passed in).

The lease lasts ``ttl_s`` on the database's clock from each renewal. The leader renews every
third of it, so two renewals may fail before it is at risk; a standby asks every sixth, so a
dead leader is replaced within ``ttl_s`` plus one retry of its last renewal. A leader that has
not renewed for ``ttl_s`` minus a margin, counted from when it sent its last successful renewal
(never later than the database stamped it), stops acting on its own: by then a standby may hold
the lease, and what it still sends would be refused anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

STEP_DOWN_MARGIN = 0.2   # of ttl_s: room for the two clocks' rates and a slow last renewal


@dataclass(frozen=True)
class LeaseTiming:
    ttl_s: float

    @property
    def renew_every_s(self) -> float:
        return self.ttl_s / 3

    @property
    def retry_every_s(self) -> float:
        return self.ttl_s / 6

    @property
    def takeover_within_s(self) -> float:
        """The longest a dead leader stays unreplaced while a standby runs."""
        return self.ttl_s + self.retry_every_s

    def must_step_down(self, last_renewal_sent_at: float, now: float) -> bool:
        """Whether a leader whose last successful renewal was sent at ``last_renewal_sent_at``
        must stop acting at ``now`` (one monotonic clock)."""
        return now - last_renewal_sent_at >= self.ttl_s * (1 - STEP_DOWN_MARGIN)
