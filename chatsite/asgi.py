"""ASGI entry point: the streaming consumer on its own route, Django for everything else."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django_application = get_asgi_application()

# Imported after Django is set up: these touch models and settings.
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.urls import re_path  # noqa: E402

from assistant import engines, internals, probes  # noqa: E402
from assistant.collector import collector_settle  # noqa: E402
from assistant.consumers import ChatStreamConsumer  # noqa: E402
from assistant.latency_probe import latency_probe  # noqa: E402
from assistant.lifespan import lifespan, worker_stopping  # noqa: E402
from assistant.logs import records_lean  # noqa: E402
from assistant.openai_api import OpenAIRouter  # noqa: E402
from assistant.routing import ChatStreamRouter  # noqa: E402

# Several workers share PROMETHEUS_MULTIPROC_DIR: when this one exits, its live gauges
# (streams open now) must stop counting.
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    import atexit

    from prometheus_client import multiprocess

    atexit.register(multiprocess.mark_process_dead, os.getpid())

# Under Daphne: when the process is asked to stop, Daphne cancels the open requests first; then
# the answers they leave behind are stored before the reactor stops (bounded, 5 s). Under another
# server no Twisted reactor runs, and this never fires: uvicorn sends ``lifespan.shutdown``
# instead (assistant/lifespan.py).
internals.await_at_shutdown(worker_stopping)

# Load the models now, once per process, so the first student does not wait for them.
if os.environ.get("CHATSITE_PRELOAD_ENGINE", "1") == "1":
    engines.preload_serving()

# The chat stream: the "direct" path is the Channels consumer, the "django" path is a view in
# the Django application (through its middleware); the router picks one per request.
chat_stream = ChatStreamRouter(
    {"direct": ChatStreamConsumer.as_asgi(), "django": django_application}
)

# Everything is loaded: out of the garbage collector's way, and collections fewer and shorter
# (assistant/collector.py); log records without the lookups no line shows (assistant/logs.py).
collector_settle(settings.CHATSITE_GC_THRESHOLD)
records_lean()

application = ProtocolTypeRouter(
    {
        "http": URLRouter(
            [
                re_path(r"^api/chat/stream(?:/direct|/django)?$", chat_stream),
                # manage.py ttft_doctor's probe: frames on a schedule, no model (staff or a key).
                re_path(r"^api/chat/stream/probe$", latency_probe),
                # The OpenAI-compatible API: a bearer key, no session, OpenAI's wire format.
                re_path(r"^v1/", OpenAIRouter()),
                # Probes answer ahead of Django: no session, no host check, nothing stored.
                re_path(r"^healthz$", probes.healthz),
                re_path(r"^readyz$", probes.readyz),
                re_path(r"", django_application),
            ]
        ),
        "lifespan": lifespan,
    }
)
