"""chatsite settings: one module, driven by the environment.

Local defaults are safe for a laptop (DEBUG on, SQLite, in-memory channel layer, the embedded
llama.cpp engine). A deployed instance sets CHATSITE_DEBUG=0 and must then provide a secret key
and allowed hosts, or it refuses to start.
"""

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in env_str(name, default).split(",") if item.strip()]


DEBUG = env_bool("CHATSITE_DEBUG", True)

SECRET_KEY = env_str("DJANGO_SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set when CHATSITE_DEBUG is off.")
    SECRET_KEY = "insecure-local-development-key-never-used-when-debug-is-off"

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]" if DEBUG else "")
if not DEBUG and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("DJANGO_ALLOWED_HOSTS must be set when CHATSITE_DEBUG is off.")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    # daphne first: its runserver replaces Django's, so `manage.py runserver` serves ASGI.
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_prometheus",
    "assistant",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "chatsite.urls"
ASGI_APPLICATION = "chatsite.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "frontend" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.csp",
            ],
        },
    },
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "CONN_MAX_AGE": None,
        "NAME": env_str("CHATSITE_SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
        "OPTIONS": {
            # Writers from several threads wait for each other instead of failing at once.
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Threads for database work from async code (assistant/db.py): reads on the path to the first
# token never wait behind persistence writes. SQLite takes one writer at a time.
CHATSITE_DB_THREADS = {
    "read": env_int("CHATSITE_DB_READ_THREADS", 4),
    "write": env_int("CHATSITE_DB_WRITE_THREADS", 1),
}

CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Sessions are read on every chat request: from the cache first, the database when it misses.
# The local-memory cache suits one process; the production profile points CACHES at Redis.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
SESSION_ENGINE = "django.contrib.sessions.backends.cached_db"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
if not DEBUG:
    SESSION_COOKIE_SECURE = env_bool("CHATSITE_SECURE_COOKIES", True)
    CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE

# No inline script anywhere: the pages load ES modules from /static/ only.
SECURE_CSP = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'", "data:"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'none'"],
    "frame-ancestors": ["'none'"],
    "form-action": ["'self'"],
}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "frontend" / "static"]
# Serve straight from the finders in development and tests; no collectstatic needed to run.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "assistant": {"handlers": ["console"], "level": env_str("CHATSITE_LOG_LEVEL", "INFO")},
    },
}

# --- chatsite ---------------------------------------------------------------------------------

# Engines are backends, like Django's caches: an alias maps to a class path and its options.
# CHATSITE_ENGINE picks which backend the "default" alias uses.
_ENGINE_BACKENDS = {
    "llamacpp": "assistant.engines.llamacpp.LlamaCppEngine",
    "vllm": "assistant.engines.openai_http.OpenAIHTTPEngine",
    "vllm-inprocess": "assistant.engines.vllm_inprocess.VLLMInProcessEngine",
    "scripted": "assistant.engines.scripted.ScriptedEngine",
}
_engine_name = env_str("CHATSITE_ENGINE", "llamacpp")
if _engine_name not in _ENGINE_BACKENDS:
    raise ImproperlyConfigured(
        f"CHATSITE_ENGINE={_engine_name!r} is not one of {', '.join(_ENGINE_BACKENDS)}."
    )
CHATSITE_ENGINES = {
    "default": {
        "BACKEND": _ENGINE_BACKENDS[_engine_name],
        "OPTIONS": {
            # llamacpp
            "MODEL_PATH": env_str("CHATSITE_LLAMACPP_MODEL_PATH"),
            "N_THREADS": env_int("CHATSITE_LLAMACPP_THREADS", 0),
            "N_CTX": env_int("CHATSITE_LLAMACPP_N_CTX", 2048),
            # vllm (OpenAI-compatible HTTP) and vllm-inprocess
            "BASE_URL": env_str("CHATSITE_VLLM_URL", "http://127.0.0.1:8000/v1"),
            "MODEL": env_str("CHATSITE_VLLM_MODEL", "HuggingFaceTB/SmolLM2-135M-Instruct"),
            "API_KEY": env_str("CHATSITE_VLLM_API_KEY"),
            # scripted
            "TTFT_MS": env_int("CHATSITE_SCRIPTED_TTFT_MS", 50),
            "ITL_MS": env_int("CHATSITE_SCRIPTED_ITL_MS", 20),
            "TOKENS": env_int("CHATSITE_SCRIPTED_TOKENS", 20),
        },
    },
}

# (requests, seconds) per session or user.
CHATSITE_RATE_LIMITS = {
    "beacon": (env_int("CHATSITE_BEACON_RATE", 120), 60),
}

CHATSITE_STREAM = {
    # Seconds of silence after which a ": ping" comment keeps proxies and the page's watchdog happy.
    "PING_INTERVAL": float(env_str("CHATSITE_PING_INTERVAL", "15")),
    "MAX_MESSAGE_CHARS": env_int("CHATSITE_MAX_MESSAGE_CHARS", 4000),
    "MAX_BODY_BYTES": env_int("CHATSITE_MAX_BODY_BYTES", 32 * 1024),
    "MAX_TOKENS": env_int("CHATSITE_MAX_TOKENS", 512),
    "HISTORY_MESSAGES": env_int("CHATSITE_HISTORY_MESSAGES", 12),
    "TEMPERATURE": float(env_str("CHATSITE_TEMPERATURE", "0.7")),
    "SYSTEM_PROMPT": env_str(
        "CHATSITE_SYSTEM_PROMPT",
        "You are a patient, friendly teaching assistant. Answer clearly and briefly.",
    ),
}
