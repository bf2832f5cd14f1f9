"""The gateway's Prometheus metrics (process-wide, as prometheus-client expects)."""

from prometheus_client import Counter, Histogram

REQUESTS = Counter("dilu_gateway_requests_total", "Invocations by function and status code",
                   ["function", "code"])
LATENCY = Histogram("dilu_gateway_request_seconds", "Invocation time seen by the gateway", ["function"],
                    buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
STREAM_FIRST = Histogram("dilu_gateway_stream_first_chunk_seconds",
                         "Time from a streamed request's arrival to its first chunk", ["function"],
                         buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
STREAM_GAP = Histogram("dilu_gateway_stream_chunk_gap_seconds", "Time between a stream's chunks", ["function"],
                       buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))
STREAMS_CUT = Counter("dilu_gateway_streams_cut_total", "Streams the gateway ended with an error frame because "
                      "the instance did not finish them (reason: failed, silent, limit, unterminated)",
                      ["function", "reason"])
ABANDONED = Counter("dilu_gateway_requests_abandoned_total", "Invocations stopped because their caller left "
                    "(stage: queued, waiting for an instance; in_flight, at the instance)", ["function", "stage"])
