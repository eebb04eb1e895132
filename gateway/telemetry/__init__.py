"""OpenTelemetry traces of every request, attempt and probe, exported over OTLP/HTTP off the request path.

Off by default: ``Runtime.tracer`` is then None and the request path's only cost is that check. On
(``telemetry.otlp_endpoint`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``), a request gets a ``RequestTrace`` at
arrival (``tracer``: the client's W3C traceparent continued, the sampling decided), each attempt's call
carries a traceparent to a self-hosted engine (``UpstreamCall.trace_headers``), and the settled request
is queued as a flat record of immutable values (``record``); the exporter (``exporter``), a task on the
event loop, writes a batch's spans (``encode``: the spans ``spans`` describes, GenAI semantic
conventions) as OTLP protobuf (``otlp``) and posts them. With ``telemetry.content`` the prompt
and the answer go in too (``content``), never for a private route. A queue that is full, or an exporter
that is down or slow, drops spans and counts them (``collector``); it never delays a request.
"""
