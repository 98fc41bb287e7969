"""What is built on the middleware extension point (``streamkit.middleware``).

- ``metrics``: ``PrometheusMiddleware`` and the app collector (needs the
  ``metrics`` extra: ``prometheus-client``).
- ``tracing``: ``TracingMiddleware`` (OpenTelemetry API only).
- ``probes``: ``streamkit run --http``: ``/healthz``, ``/readyz``, ``/metrics``.

The modules are not imported here, so that an app without the optional
dependencies can import this package.
"""
