"""ASGI entry point: the streaming consumer on its own route, Django for everything else."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
django_application = get_asgi_application()

# Imported after Django is set up: these touch models and settings.
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path, re_path  # noqa: E402

from assistant import engines  # noqa: E402
from assistant.consumers import ChatStreamConsumer  # noqa: E402

# Several workers share PROMETHEUS_MULTIPROC_DIR: when this one exits, its live gauges
# (streams open now) must stop counting.
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    import atexit

    from prometheus_client import multiprocess

    atexit.register(multiprocess.mark_process_dead, os.getpid())

# Load the model now, once per process, so the first student does not wait for it.
if os.environ.get("CHATSITE_PRELOAD_ENGINE", "1") == "1":
    engines.preload()

application = ProtocolTypeRouter(
    {
        "http": URLRouter(
            [
                path("api/chat/stream", ChatStreamConsumer.as_asgi()),
                re_path(r"", django_application),
            ]
        ),
    }
)
