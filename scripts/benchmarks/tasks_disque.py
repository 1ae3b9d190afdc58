"""disque-py's side of ``scripts/bench tasks``: an ``add`` task of a ``disque_py.tasks.App`` and
its producer (the same measure as dramatiq's).

    worker:   disque-py worker benchmarks.tasks_disque:app -c 8
    producer: python -m benchmarks.tasks_disque --tasks 5000 --latency 200

The nodes come from ``BENCH_DISQUE_NODES``. ``BENCH_OTEL`` (``scripts/bench tasks --otel``) says
what traces cost: ``sdk`` sets OpenTelemetry's SDK as the global tracer provider, every span
recorded and handed to an exporter that drops it (a BatchSpanProcessor's thread, as in
production); ``api``, opentelemetry installed with no provider; ``off``, its import refused by
the benchmark (a sitecustomize), as where the extra is not installed.
"""

from __future__ import annotations

import argparse
import os

from disque_py.tasks import App

OTEL = os.environ.get("BENCH_OTEL", "")


def _trace_into_nothing() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)


if OTEL == "sdk":
    _trace_into_nothing()

app = App(nodes=os.environ.get("BENCH_DISQUE_NODES", "127.0.0.1:7711"))


@app.task(name="bench.add", queue="bench", retries=0, result_ttl=300)
def add(a, b):
    return a + b


def main() -> None:
    from .tasks_measure import measure

    p = argparse.ArgumentParser()
    p.add_argument("--tasks", type=int, default=5000)
    p.add_argument("--latency", type=int, default=200)
    args = p.parse_args()
    measure(lambda i: add.send(i, i), lambda ref, timeout: ref.result(timeout=timeout), args.tasks, args.latency)
    if OTEL:  # the run measured what it says it did
        from disque_py.tasks.tracing import active, available

        state = "sdk" if active(app) is not None else "api" if available() else "off"
        if state != OTEL:
            raise SystemExit("BENCH_OTEL=%s, but the app's traces were %s" % (OTEL, state))


if __name__ == "__main__":
    main()
