"""Other projects' internals that chatsite relies on, all in one package.

Every access here goes past the documented API of Daphne, Twisted, Django, Channels, uvicorn or
prometheus_client: private attributes, undocumented methods overridden, object graphs that happen
to hold. Each function or class names what it relies on, and
``tests/assistant/test_contracts.py`` checks each one against the installed release, failing by
name when an upgrade changes it. The rest of the code calls these, through this package's names
(``internals.kernel_unsent``), and keeps its own logic.

- ``sockets``: the connection behind an application's ``send`` (Daphne's and uvicorn's), what
  its buffers and the kernel's send queue hold, and Twisted's write path.
- ``daphne_server``: Daphne's server, its requests, ports and connections, its command line,
  and Twisted's reactor at shutdown.
- ``frameworks``: Django's CSRF check and request log, Channels' dispatch, prometheus_client's
  histogram values.

Checked against Django 6.1.3, Daphne 4.2.3, Twisted 26.10.0, Channels 4.3.2, uvicorn 0.54.0 and
prometheus_client 0.26.0 (``CHECKED_AGAINST``). ``SUPPORTED`` repeats the bounds in
pyproject.toml; raise one only once the contract tests pass on the new release.

Importing this package imports no model, reads no setting and installs no Twisted reactor:
``chatsite/asgi.py`` and ``chatsite/server.py`` import it before Django is set up. Daphne and
Twisted are imported inside the functions that need them (importing ``daphne.server`` installs
Twisted's asyncio reactor).
"""

from assistant.internals.daphne_server import (
    await_at_shutdown,
    connections_close_after_response,
    daphne_command_line,
    daphne_http_direct,
    daphne_server_class,
    installed_reactor,
    listener_close,
    listening_ports,
    on_sigterm,
    request_transport,
    requests_arriving,
    requests_open,
    server_endpoints_map,
)
from assistant.internals.frameworks import (
    CsrfCheck,
    consumer_handler,
    histogram_values,
    response_logged,
)
from assistant.internals.sockets import (
    UVICORN_HTTP1,
    buffered_bytes,
    daphne_socket,
    kernel_unsent,
    uvicorn_socket,
    writes_at_turn_end,
)

#: The releases every access in this package was checked against.
CHECKED_AGAINST: dict[str, str] = {
    "django": "6.1.3",
    "daphne": "4.2.3",
    "twisted": "26.10.0",
    "channels": "4.3.2",
    "uvicorn": "0.54.0",
    "prometheus-client": "0.26.0",
}

#: The releases the accesses are held to: the same bounds as pyproject.toml's dependencies.
SUPPORTED: tuple[str, ...] = (
    "django>=6.1,<6.2",
    "channels>=4.3,<4.4",
    "daphne>=4.2,<4.3",
    "twisted>=24.10,<27",
    "uvicorn>=0.34,<0.55",
    "prometheus-client>=0.17,<0.27",
)

__all__ = [
    "CHECKED_AGAINST",
    "SUPPORTED",
    "UVICORN_HTTP1",
    "CsrfCheck",
    "await_at_shutdown",
    "buffered_bytes",
    "connections_close_after_response",
    "consumer_handler",
    "daphne_command_line",
    "daphne_http_direct",
    "daphne_server_class",
    "daphne_socket",
    "histogram_values",
    "installed_reactor",
    "kernel_unsent",
    "listener_close",
    "listening_ports",
    "on_sigterm",
    "request_transport",
    "requests_arriving",
    "requests_open",
    "response_logged",
    "server_endpoints_map",
    "uvicorn_socket",
    "writes_at_turn_end",
]
