"""Django's settings as the code every answer runs reads them: ``conf.settings.NAME``.

``django.conf.settings`` is a lazy object: every attribute read runs a method written in Python
(``LazyObject.__getattribute__``), 0.3 µs a read where an attribute of the object it stands for
takes 0.01 µs, and an answer reads settings about thirty times. Here ``settings`` is that object
itself, looked up at the first read and again after ``override_settings`` (or anything else that
sends ``setting_changed``) has put another in its place. The values are Django's, unchanged;
the names Django's lazy object treats specially (``SECRET_KEY``'s check that it is set,
``MEDIA_URL``'s and ``STATIC_URL``'s script prefix) are read from ``django.conf.settings``.
"""

from typing import Any

from django.conf import settings as _lazy
from django.core.signals import setting_changed


def __getattr__(name: str) -> Any:
    """``settings``, looked up (module attributes Python does not find come here)."""
    if name != "settings":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _lazy.INSTALLED_APPS  # noqa: B018 -- sets Django's settings up, if nothing has yet
    wrapped = globals()["settings"] = _lazy._wrapped
    return wrapped


def _forget(**kwargs: Any) -> None:
    globals().pop("settings", None)


setting_changed.connect(_forget)
