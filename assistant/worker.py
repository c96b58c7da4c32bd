"""The HTTP server this worker process runs under, as its stream records name it.

``python -m chatsite.server`` names itself ``daphne`` and ``python -m chatsite.uvicorn_server``
``uvicorn``, before either serves a request; anything else (``manage.py runserver``, a test's
in-process client) names none, and its records say so with an empty name. nginx can split the
students between a pool of each (deploy/nginx/chatsite-servers.conf); the staff dashboard
compares the two by this name (``services/dashboard.py``).
"""

#: The servers a worker can run under.
SERVERS: tuple[str, ...] = ("daphne", "uvicorn")

_server = ""


def server_set(name: str) -> None:
    """Name the server this process runs under: one of ``SERVERS``."""
    global _server
    if name not in SERVERS:
        raise ValueError(f"unknown server {name!r}: one of {', '.join(SERVERS)}")
    _server = name


def server_name() -> str:
    """The server this process runs under; "" when it was not named."""
    return _server
