"""Level two: request serving. Inference functions driven by a request trace and training jobs
share a small cluster; every ``tick_s`` each GPU's instances get compute shares, serve batches
at the speed their profile gives for that share, and the functions scale.

- Arrivals: the trace, scaled per function so that its busy seconds (the 95th percentile of its
  per-second rate) ask ``load`` x what one instance serves at its profiled request share, and
  shifted by a different offset per function (so their bursts do not coincide).
- Routing, as the gateway does: each request goes at once to the ready instance with the fewest
  requests outstanding (queued there or in its batch); while none is ready it waits at the
  function (the cold-start queue) and is routed when one becomes ready. A stopped instance
  leaves the routes and drains what it holds.
- Service: an instance serves its own queue (first come, first served) in batches of the size
  the runtime would form (``ModelProfile.batch_for``), each taking the profile's latency at the
  instance's current share; a request's latency is its wait plus its batch.
- Streams (a function that ``generates`` text): each request is a stream of ``tokens`` steps;
  an instance runs one batch of streams, admitting queued ones at each step up to its bound
  (iteration-level batching), each step taking the profile's time for the running batch; a
  stream occupies its slot for its whole duration, and its latency (against the SLO) is its
  time to the first token.
- Contention: shares on one GPU are scaled down together when they add up past 1.
- Isolation (Dilu's vertical shares): while a latency instance on a GPU has requests waiting or
  in service, batch instances there keep only their floors and serving latency instances take
  the rest up to their limits, as the shim's hold does (``dilu.policy.isolation``).
- Shares, scaling and keep-alive follow the policy (``dilu.sim.policies``).
- Cold start: a new instance serves ``cold_start_s`` after it is placed.
- Training: a job progresses at its share per second (1.0 = a whole GPU alone).
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dilu.policy.autoscale import ScalingInputs, ScalingParams, ScalingState
from dilu.policy.isolation import Occupant
from dilu.policy.keepalive import KeepAliveParams
from dilu.policy.scheduler import ClusterSnapshot, PlacementRequest
from dilu.policy.vertical import InstanceSlice, VerticalContext, VerticalParams, VerticalState
from dilu.sim.models import MODELS, ModelProfile, load_model
from dilu.sim.placement import GiB, empty_cluster
from dilu.sim.policies import LIVE, SimPolicy

REQUEST_TIMEOUT_S = 30.0      # a request waiting longer is dropped (and counted as a violation)
RATE_LAG_S = 1.0              # how old the newest request count the controller sees is
# The baselines' keep-alive: the fixed window alone, never weighed against cold starts.
FIXED_KEEPALIVE = ScalingParams(keepalive=KeepAliveParams(min_samples=10**9, weighed_extension=0.0))


@dataclass(frozen=True)
class ServingSetup:
    arrivals: np.ndarray                  # the trace's arrival times (seconds)
    models: tuple[str | ModelProfile, ...] = MODELS   # profile names, or profiles
    scale_arrivals: bool = True           # False: every function gets the trace as it is
    load: float = 0.7
    gpus: int = 8
    gpus_per_node: int = 4
    gpu_memory_gb: float = 40.0
    trainings: int = 4                    # one-GPU training jobs running throughout
    training_slice: tuple[float, float] = (0.3, 1.0)
    training_memory_gb: float = 12.0
    tick_s: float = 0.1
    cold_start_s: float = 5.0
    keep_alive_s: float = 60.0
    max_instances: int = 8
    duration_s: float | None = None       # default: the trace's length
    deployed: bool = True                 # each function starts with the instance its deploy verified
    per_function: tuple[np.ndarray, ...] | None = None   # each model's own arrivals, instead of the trace's
    tokens: tuple[np.ndarray | None, ...] | None = None   # per model: each stream's token count (generators)
    profiled: bool = True                 # False: functions scale by concurrency, as an unprofiled one does


@dataclass
class ServingResult:
    duration_s: float = 0.0
    served: int = 0
    violations: int = 0                   # over the SLO, dropped, or left waiting at the end
    latencies: array = field(default_factory=lambda: array("d"))   # seconds, per request served (8 bytes each)
    cold_starts: int = 0                  # starts a request waited for: it came when none was ready
    starts: int = 0                       # every instance start (on demand, scale-out, pre-warm)
    unplaced: int = 0                     # instance starts no GPU could take
    training_progress: float = 0.0        # summed over jobs, in whole-GPU seconds
    gpu_seconds: float = 0.0
    instance_seconds: float = 0.0         # instances held (starting or ready), integrated
    active_gpus: list[int] = field(default_factory=list)   # one sample per second
    arrivals: int = 0
    jobs: int = 0                         # training jobs that ran

    @property
    def slo_violation_rate(self) -> float:
        return self.violations / self.arrivals if self.arrivals else 0.0


@dataclass
class _Instance:
    id: str
    function: str
    device: int
    request: PlacementRequest
    ready_at: float
    share: float = 0.0
    free_share: float = 0.0               # a batch instance's share while no latency work runs
    busy_s: float = 0.0                   # of the current tick, the time its batches (steps) ran
    free_at: float = 0.0                  # when its current batch (or step) ends
    in_batch: int = 0                     # requests in its current batch
    queue: deque = field(default_factory=deque)     # (arrival, tokens) routed here, not yet served
    running: list = field(default_factory=list)     # streams in its batch: [arrival, tokens left, started]

    def outstanding(self, now: float) -> int:
        """Requests it holds: queued, in its batch, streams running (what the gateway counts)."""
        return len(self.queue) + len(self.running) + (self.in_batch if self.free_at > now else 0)

    def busy(self, now: float) -> bool:
        """Whether it holds work: queued, running on from the last tick, streams (the shim holds
        batch work beside it; a draining instance stops once it holds none)."""
        return bool(self.queue or self.running) or self.free_at > now


@dataclass
class _Function:
    model: ModelProfile
    arrivals: np.ndarray
    tokens: np.ndarray | None = None      # a stream's steps, per arrival (generators)
    next_arrival: int = 0
    queue: deque = field(default_factory=deque)     # (arrival, tokens) waiting for any ready instance
    instances: list[_Instance] = field(default_factory=list)
    draining: list[_Instance] = field(default_factory=list)   # off the routes, finishing what they hold
    scaling: ScalingState = field(default_factory=ScalingState)
    last_second: int = 0                  # arrivals in the second that just ended
    low_since: float | None = None        # eager scale-in: since when fewer would do
    cold: bool = False                    # a request arrived while no instance was ready


def sim_vertical_params(tick_s: float) -> VerticalParams:
    """The live vertical policy's parameters at the simulator's time scale. The live period is
    5 ms and a kernel-launch cycle is one request's burst of kernels; a tick here is tens of ms,
    so a cycle is an instance's busy period (its queue not empty), a gap of one tick ends it, and
    long cycles are the signal rather than outliers."""
    return VerticalParams(period_s=tick_s, idle_gap_periods=1, klc_min_periods=1, outlier_stretch=float("inf"),
                          latency_idle_s=2 * tick_s, contention_window_s=1.5 * tick_s)


def _arrivals_for(setup: ServingSetup, model: ModelProfile, position: int, duration: float) -> np.ndarray:
    trace = setup.arrivals
    length = max(float(trace[-1]) if len(trace) else 0.0, 1.0)
    busy_rate = max(float(np.percentile(np.bincount(trace.astype(np.int64)), 95)), 1e-9)
    target = setup.load * model.capacity(model.profile.sm_request)
    rng = np.random.default_rng(position)
    factor = target / busy_rate
    copies = int(math.ceil(factor))
    offset = position * length / max(len(setup.models), 1)
    # Each copy's requests move by up to a second, independently: copies stacked in step would
    # arrive in clumps of ``copies`` requests at one instant, which no population of clients does.
    jitter = (lambda: rng.random(len(trace))) if copies > 1 else (lambda: 0.0)
    shifted = [(trace + offset + jitter()) % length for _ in range(copies)]
    times = np.sort(np.concatenate(shifted))
    times = times[rng.random(len(times)) < factor / copies]
    return times[times < duration]


class _Cluster:
    """The snapshot the live scheduler places on, and what runs where."""

    def __init__(self, setup: SimPolicy, serving: ServingSetup) -> None:
        nodes = math.ceil(serving.gpus / serving.gpus_per_node)
        self.snapshot: ClusterSnapshot = empty_cluster(nodes, serving.gpus_per_node, serving.gpu_memory_gb)
        self.index = {d.id: i for i, d in enumerate(self.snapshot.devices)}
        self.policy = setup
        self.on_device: dict[int, list[_Instance]] = {}
        self.count = 0

    def place(self, function: str, request: PlacementRequest, ready_at: float) -> _Instance | None:
        decision = self.policy.scheduler.place(request, self.snapshot)
        if not decision.ok:
            return None
        device = self.index[decision.devices[0]]
        self.snapshot = self.snapshot.with_placement((device,), request)
        self.count += 1
        instance = _Instance(f"{function}-{self.count}", function, device, request, ready_at)
        self.on_device.setdefault(device, []).append(instance)
        return instance

    def full(self, device: int) -> bool:
        return sum(i.share for i in self.on_device.get(device, ())) >= 0.99

    def remove(self, instance: _Instance) -> None:
        self.snapshot = self.snapshot.without(instance.device, instance.request)
        self.on_device[instance.device].remove(instance)


def _fixed_share(policy: SimPolicy, instance: _Instance) -> float:
    return {"limit": instance.request.sm_limit, "request": instance.request.sm_request,
            "whole": 1.0}[policy.shares]


def simulate_serving(policy: SimPolicy, setup: ServingSetup,
                     progress: Callable[[float], None] | None = None) -> ServingResult:
    """Runs ``setup`` under ``policy``; ``progress(seconds)`` as simulated time passes."""
    duration = setup.duration_s or (float(setup.arrivals[-1]) if len(setup.arrivals) else 0.0)
    cluster = _Cluster(policy, setup)
    result = ServingResult(duration_s=duration)
    vertical_params = sim_vertical_params(setup.tick_s)
    vertical_states: dict[int, VerticalState] = {}
    scaling_params = policy.scaling
    request_ms, limit_ms = setup.training_slice
    trainings = []
    for j in range(setup.trainings):
        job = cluster.place(f"training-{j}", PlacementRequest(
            f"training-{j}", int(setup.training_memory_gb * GiB), request_ms, limit_ms, "batch", gpu=True), 0.0)
        if job is None:
            result.unplaced += 1
        else:
            trainings.append(job)
    result.jobs = len(trainings)
    functions = {}
    for position, name in enumerate(setup.models):
        model = name if isinstance(name, ModelProfile) else load_model(name)
        if setup.per_function is not None:
            arrivals = setup.per_function[position][setup.per_function[position] < duration]
        elif setup.scale_arrivals:
            arrivals = _arrivals_for(setup, model, position, duration)
        else:
            arrivals = setup.arrivals[setup.arrivals < duration]
        tokens = setup.tokens[position] if setup.tokens is not None else None
        if model.generates and tokens is None:
            raise ValueError(f"{model.name} generates text: its streams need token counts (ServingSetup.tokens)")
        functions[model.name] = _Function(model, arrivals, tokens)
        result.arrivals += len(arrivals)

    def start(fn: _Function, now: float) -> None:
        p = fn.model.profile
        instance = cluster.place(fn.model.name, PlacementRequest(
            fn.model.name, int(fn.model.memory_gb * GiB), p.sm_request, p.sm_limit, "latency", gpu=True),
            now + setup.cold_start_s)
        if instance is None:
            result.unplaced += 1
            return
        fn.instances.append(instance)
        result.starts += 1

    def stop(fn: _Function, instance: _Instance) -> None:
        fn.instances.remove(instance)
        if instance.busy(now):
            fn.draining.append(instance)    # off the routes; it finishes what it holds
        else:
            cluster.remove(instance)

    if setup.deployed:   # a deploy starts one instance to verify it, before any request
        for fn in functions.values():
            start(fn, -setup.cold_start_s)
        result.starts = 0

    ticks = int(duration / setup.tick_s)
    per_second = max(1, int(round(1.0 / setup.tick_s)))
    now = 0.0
    for tick in range(ticks):
        now = tick * setup.tick_s
        end = now + setup.tick_s
        for fn in functions.values():
            ready = [i for i in fn.instances if now >= i.ready_at]
            while fn.queue and ready:                     # an instance became ready: the waiters go
                _route(ready, fn.queue.popleft(), now)
            arrivals = fn.arrivals
            while fn.next_arrival < len(arrivals) and arrivals[fn.next_arrival] < end:
                index = fn.next_arrival
                request = (arrivals[index], int(fn.tokens[index]) if fn.tokens is not None else 0)
                if ready:
                    _route(ready, request, now)
                else:
                    fn.queue.append(request)
                fn.next_arrival += 1
            for queue in (fn.queue, *(i.queue for i in fn.instances), *(i.queue for i in fn.draining)):
                while queue and now - queue[0][0] > REQUEST_TIMEOUT_S:
                    queue.popleft()
                    result.violations += 1
            if fn.cold and ready:      # the start that request waited for is over
                result.cold_starts += 1
                fn.cold = False
            fn.cold = fn.cold or (bool(fn.queue) and not ready)
            if fn.queue and not fn.instances:          # a request waits: start one at once
                start(fn, now)
        if tick % per_second == 0:
            for fn in functions.values():
                _scale(policy, setup, fn, now, scaling_params, start, stop, cluster.full)
        _assign_shares(policy, cluster, functions, now, vertical_params, vertical_states)
        for fn in functions.values():
            up_to = fn.model.bound if policy.batching == "bound" or fn.model.generates else fn.model.profile.batch
            for instance in (*fn.instances, *fn.draining):
                (_step_streams if fn.model.generates else _serve)(fn.model, instance, now, setup.tick_s, result,
                                                                  up_to)
            for instance in [i for i in fn.draining if not i.busy(end)]:
                fn.draining.remove(instance)
                cluster.remove(instance)
        for job in trainings:
            # Held only while latency work runs (the shim gives up milliseconds, not whole ticks).
            running = min(1.0, sum(i.busy_s for i in cluster.on_device.get(job.device, ()) if i is not job)
                          / setup.tick_s)
            result.training_progress += (running * job.share + (1 - running) * job.free_share) * setup.tick_s
        busy = sum(1 for members in cluster.on_device.values() if members)
        result.gpu_seconds += busy * setup.tick_s
        result.instance_seconds += sum(len(fn.instances) + len(fn.draining) for fn in functions.values()) * setup.tick_s
        if tick % per_second == 0:
            result.active_gpus.append(busy)
            if progress is not None:
                progress(1.0)
    for fn in functions.values():
        held = sum(i.outstanding(now) for i in (*fn.instances, *fn.draining))
        result.violations += len(fn.queue) + held + (len(fn.arrivals) - fn.next_arrival)
        result.cold_starts += fn.cold
    return result


def _route(ready: list[_Instance], request: tuple[float, int], now: float) -> None:
    """The gateway's choice: the ready instance with the fewest requests outstanding."""
    min(ready, key=lambda i: i.outstanding(now)).queue.append(request)


def _scale(policy: SimPolicy, setup: ServingSetup, fn: _Function, now: float, params: ScalingParams,
           start: Callable, stop: Callable, device_full: Callable[[int], bool]) -> None:
    """Once a second: the controller's own composition (``dilu.policy.autoscale.plan``) decides the
    count, from the lazy scaler or, for the baselines, their count for the last second's rate."""
    model, p = fn.model, fn.model.profile
    # The controller reads the newest second every gateway has surely flushed: the one that
    # ended a second ago (the second just ended still lacks its last flush's counts).
    seen = now - RATE_LAG_S
    rate = int(np.searchsorted(fn.arrivals, seen) - np.searchsorted(fn.arrivals, seen - 1.0))
    if rate:
        fn.scaling = LIVE["observe"](fn.scaling, seen, rate, params)
    current = len(fn.instances)
    by_rate = None if policy.horizontal == "lazy" else _eager_count(policy, setup, fn, now, rate)
    # No vertical headroom: at the limit, or on a GPU with nothing left to give.
    at_limit = all(now < i.ready_at or i.share >= 0.95 * i.request.sm_limit or device_full(i.device)
                   for i in fn.instances) if policy.shares == "vertical" else True
    # Idle since the last request or, before any, since the function was deployed (at 0), as the
    # controller counts it.
    last = float(fn.arrivals[fn.next_arrival - 1]) if fn.next_arrival else 0.0   # the gateways' own clock
    decision, fn.scaling = LIVE["plan"](ScalingInputs(
        now=now, current=current, min_instances=0, max_instances=setup.max_instances,
        starting=sum(1 for i in fn.instances if now < i.ready_at), queued=len(fn.queue),
        in_flight=sum(i.outstanding(now) for i in fn.instances),
        concurrency_per_instance=model.occupancy_target() or 2 * p.batch,
        target_concurrency=model.occupancy_target() or math.inf,
        # The controller's yardstick is the profile's measured throughput, as here.
        rate_per_s=rate, throughput_per_instance=p.throughput_per_s if setup.profiled else None,
        at_vertical_limit=at_limit, latency_target_s=model.slo_s,
        idle_s=max(0.0, now - last), cold_start_s=setup.cold_start_s,
        keep_alive_s=setup.keep_alive_s, memory_gb=model.memory_gb),
        fn.scaling, params if policy.keepalive == "histogram" else FIXED_KEEPALIVE, by_rate)
    for _ in range(max(0, decision.desired - current)):
        start(fn, now)
    # As the controller: starting instances go first, then the newest ready ones.
    victims = sorted(fn.instances, key=lambda i: (now >= i.ready_at, i.ready_at))[:max(0, current - decision.desired)]
    for instance in victims:
        stop(fn, instance)


def _eager_count(policy: SimPolicy, setup: ServingSetup, fn: _Function, now: float, rate: int) -> int:
    """The baselines' conventional rule: as many instances as the last second's rate needs at the
    fixed share at once; one fewer after each keep-alive window with fewer needed."""
    model, p, current = fn.model, fn.model.profile, len(fn.instances)
    share = {"limit": p.sm_limit, "request": p.sm_request, "whole": 1.0, "priority": p.sm_limit}[policy.shares]
    needed = min(setup.max_instances, math.ceil(rate / model.capacity(share))) if rate else current
    if needed >= current:
        fn.low_since = None
        return needed
    fn.low_since = fn.low_since if fn.low_since is not None else now
    if now - fn.low_since < setup.keep_alive_s:
        return current
    fn.low_since = now     # the next one goes after another quiet window
    return current - 1


def _assign_shares(policy: SimPolicy, cluster: _Cluster, functions: dict[str, _Function], now: float,
                   params: VerticalParams, states: dict[int, VerticalState]) -> None:
    for device, members in cluster.on_device.items():
        running = [i for i in members if now >= i.ready_at]
        if not running:
            continue

        def busy(instance: _Instance) -> bool:
            # Training is always busy; a latency instance while it holds work of its own.
            return instance.function not in functions or instance.busy(now)

        if policy.shares == "vertical":
            slices = tuple(InstanceSlice(i.id, i.request.cls, i.request.sm_request, i.request.sm_limit)
                           for i in running)
            active = frozenset(i.id for i in running if busy(i))
            shares, states[device] = LIVE["allocate"](
                VerticalContext(now=now, slices=slices, active=active, params=params),
                states.get(device, VerticalState()))
            if params.isolated:
                occupants = tuple(Occupant(i.id, i.request.cls, i.request.sm_request, i.request.sm_limit, busy(i))
                                  for i in running)
                free, shares = shares, LIVE["isolate"](occupants, shares)
            else:
                free = shares
            for instance in running:
                instance.share = shares.get(instance.id, 0.0)
                instance.free_share = free.get(instance.id, 0.0)
        elif policy.shares == "priority":
            taken = 0.0
            for instance in running:
                if instance.request.cls == "latency":
                    instance.share = 1.0 if busy(instance) else 0.0
                    taken += instance.share
            for instance in running:
                if instance.request.cls != "latency":
                    instance.share, instance.free_share = max(0.0, 1.0 - taken), 1.0
        else:
            for instance in running:
                instance.share = instance.free_share = _fixed_share(policy, instance)
        # More than the GPU has among those running work: they slow down together (an idle
        # instance launches nothing, whatever its share). Free shares are those of batch work alone.
        for key, using in (("share", [i for i in running if busy(i)]),
                           ("free_share", [i for i in running if i.request.cls != "latency"])):
            total = sum(getattr(i, key) for i in using)
            if total > 1.0:
                for instance in running:
                    setattr(instance, key, getattr(instance, key) / total)


def _serve(model: ModelProfile, instance: _Instance, now: float, tick: float, result: ServingResult,
           up_to: int) -> None:
    """A ready instance runs batches back to back from its queue while the tick lasts; a batch
    starts when the instance is free and its first request has arrived, takes the profile's time
    at the instance's share, and holds the requests that had arrived by its start, at most
    ``up_to`` (the profile's batch, or the spec's bound where the runtime batches a queue to it)."""
    end, queue = now + tick, instance.queue
    instance.busy_s = max(0.0, min(instance.free_at, end) - now)   # a batch running on from the last tick
    if now < instance.ready_at or instance.share <= 0:
        return
    at = max(instance.free_at, now)
    while queue:
        at = max(at, queue[0][0])
        if at >= end:
            break
        waiting = 0
        for arrival, _ in queue:
            if arrival > at or waiting == up_to:
                break
            waiting += 1
        batch = model.batch_for(waiting, up_to)
        done = at + model.latency(batch, instance.share)
        instance.busy_s += min(done, end) - at
        instance.in_batch = min(batch, waiting)
        for _ in range(min(batch, waiting)):
            latency = done - queue.popleft()[0]
            result.served += 1
            result.latencies.append(latency)
            if latency > model.slo_s:
                result.violations += 1
        at = done
    instance.free_at = at


def _step_streams(model: ModelProfile, instance: _Instance, now: float, tick: float, result: ServingResult,
                  up_to: int) -> None:
    """A ready instance steps its running streams while the tick lasts: before each step, queued
    streams that have arrived join up to ``up_to``; a step takes the profile's time for the
    running batch at the instance's share and gives every running stream one token. A stream's
    latency is its first token's; it leaves the batch with its last."""
    end, queue, running = now + tick, instance.queue, instance.running
    instance.busy_s = max(0.0, min(instance.free_at, end) - now)
    if now < instance.ready_at or instance.share <= 0:
        return
    at = max(instance.free_at, now)
    while running or queue:
        if not running:
            at = max(at, queue[0][0])
        if at >= end:
            break
        while queue and len(running) < up_to and queue[0][0] <= at:
            arrival, tokens = queue.popleft()
            running.append([arrival, max(1, tokens), False])
        done = at + model.latency(model.batch_for(len(running), up_to), instance.share)
        instance.busy_s += min(done, end) - at
        for stream in running:
            stream[1] -= 1
            if not stream[2]:
                stream[2] = True
                latency = done - stream[0]
                result.latencies.append(latency)
                if latency > model.slo_s:
                    result.violations += 1
        finished = [s for s in running if s[1] <= 0]
        result.served += len(finished)
        running[:] = [s for s in running if s[1] > 0]
        at = done
    instance.free_at = at
