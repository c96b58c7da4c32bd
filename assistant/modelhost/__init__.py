"""The embedded model in its own supervised process, shared by every web worker of a host.

``supervisor.py`` binds the socket and keeps a model process (``runner.py``) running behind it;
``protocol.py`` is the wire format; ``assistant.engines.model_process`` is the workers' side. A
crash in native code ends the model process only: the workers tell their students, keep
serving, and the supervisor starts a new one.
"""
