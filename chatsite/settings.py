"""chatsite settings: one module, driven by the environment.

Local defaults are safe for a laptop (DEBUG on, SQLite, in-memory channel layer and cache, the
embedded llama.cpp engine). With CHATSITE_DEBUG=0 a secret key and allowed hosts are required;
CHATSITE_PROFILE=production also requires PostgreSQL (DATABASE_URL) and Redis
(CHATSITE_REDIS_URL). An unsafe configuration refuses to start, naming what is missing.
"""

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from chatsite.env import database_from_url, env_bool, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent

# "local" (the default: a laptop, a classroom server, the tests) or "production" (nginx in front
# of several Daphne workers sharing PostgreSQL and Redis; see docs/deploy.md).
PROFILE = env_str("CHATSITE_PROFILE", "local")
if PROFILE not in {"local", "production"}:
    raise ImproperlyConfigured(
        f"CHATSITE_PROFILE must be 'local' or 'production', not {PROFILE!r}."
    )
DEBUG = env_bool("CHATSITE_DEBUG", PROFILE == "local")

_DEV_SECRET_KEY = "insecure-local-development-key-never-used-when-debug-is-off"
SECRET_KEY = env_str("DJANGO_SECRET_KEY") or (_DEV_SECRET_KEY if DEBUG else "")
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]" if DEBUG else "")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS")
DATABASE_URL = env_str("DATABASE_URL")
REDIS_URL = env_str("CHATSITE_REDIS_URL")


def _unsafe() -> list[str]:
    """What makes this configuration unfit to serve the public."""
    problems = []
    if PROFILE == "production" and DEBUG:
        problems.append("CHATSITE_DEBUG must be off")
    if not DEBUG:
        if len(SECRET_KEY) < 40 or SECRET_KEY == _DEV_SECRET_KEY:
            problems.append("DJANGO_SECRET_KEY must be set to a random value of 40+ characters")
        if not ALLOWED_HOSTS or "*" in ALLOWED_HOSTS:
            problems.append("DJANGO_ALLOWED_HOSTS must list this site's host names")
    if PROFILE == "production":
        if not DATABASE_URL:
            problems.append("DATABASE_URL must point at PostgreSQL")
        if not REDIS_URL:
            problems.append("CHATSITE_REDIS_URL must point at Redis")
    return problems


if _unsafe():
    raise ImproperlyConfigured("Refusing to start: " + "; ".join(_unsafe()) + ".")

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
    # WhiteNoise, wrapped so that the stack stays async (no thread hop per request).
    "assistant.middleware.StaticFilesMiddleware",
    # Page loads beyond CHATSITE_PAGES_AT_ONCE wait their turn, then get a 503 busy page.
    "assistant.middleware.PageLineMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The page's language: the one the student chose (a cookie), else the browser's.
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

# Off by default: nginx compresses in the production profile. When on, event streams are left
# alone (compression makes proxies and browsers wait for fuller blocks).
if env_bool("CHATSITE_GZIP", False):
    MIDDLEWARE.insert(
        MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
        "assistant.middleware.EventStreamSafeGZipMiddleware",
    )

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
                "assistant.i18n.page_language",
            ],
        },
    },
]

if DATABASE_URL:
    # Connections per worker process: the database threads (below) plus the page views.
    DATABASES = {
        "default": database_from_url(
            DATABASE_URL,
            pool_size=env_int("CHATSITE_DB_POOL_SIZE", 8),
            pool_timeout=float(env_str("CHATSITE_DB_POOL_TIMEOUT", "2")),
        )
    }
else:
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
    # Long reads for people, not students (a class's CSV export): never on the readers above.
    "bulk": env_int("CHATSITE_DB_BULK_THREADS", 1),
}

# New container objects between two collections of Python's young generation, once what start-up
# loaded is frozen (assistant/collector.py); 0: Python's own collector (every 700, none frozen).
CHATSITE_GC_THRESHOLD = env_int("CHATSITE_GC_THRESHOLD", 10000)

# Django's requests (pages, the history API, beacons) a worker runs at once, each on a thread
# with a database connection (assistant/services/page_line.py): with the threads above they fit
# the pool. The rest wait their turn up to WAIT_S seconds, then get a 503 busy page with
# Retry-After. 0: no limit.
CHATSITE_PAGES = {
    "AT_ONCE": env_int("CHATSITE_PAGES_AT_ONCE", 4),
    "WAIT_S": float(env_str("CHATSITE_PAGES_WAIT_S", "5")),
}

# One process: in memory. Several workers: Redis, shared by all of them (sessions' cache, rate
# limits, dashboard snapshots; the channel layer for anything that talks between workers).
if REDIS_URL:
    _redis_prefix = env_str("CHATSITE_REDIS_PREFIX", "chatsite")
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": f"{_redis_prefix}:channels"},
        }
    }
    CACHES = {
        "default": {
            # Django's Redis cache, one client (one connection pool) per process.
            "BACKEND": "assistant.cache.SharedRedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": _redis_prefix,
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
# Sessions are read on every chat request: from the cache first, the database when it misses.
SESSION_ENGINE = "django.contrib.sessions.backends.cached_db"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
# The API answers a failed CSRF check with a JSON error, pages with Django's own.
CSRF_FAILURE_VIEW = "assistant.stream_views.csrf_failure"
LOGIN_URL = "admin:login"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Behind TLS (nginx terminates it and says so in X-Forwarded-Proto): cookies only over HTTPS,
# and browsers told to use nothing else. On by default whenever DEBUG is off.
TLS = env_bool("CHATSITE_TLS", not DEBUG)
if TLS:
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("CHATSITE_HSTS_SECONDS", 31_536_000)
    SECURE_SSL_REDIRECT = env_bool("CHATSITE_SSL_REDIRECT", False)

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

# Simplified Chinese and English: every page, and the messages of the API's errors (their codes
# stay the same). Catalogues are in locale/, compiled by scripts/setup (manage.py
# compilecatalogues). A zh-CN, zh-SG or zh browser gets zh-hans (Django's own fallbacks).
LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = env_str("CHATSITE_STATIC_ROOT", str(BASE_DIR / "staticfiles"))
STATICFILES_DIRS = [BASE_DIR / "frontend" / "static"]
# Serve straight from the finders in development and tests; no collectstatic needed to run.
WHITENOISE_USE_FINDERS = True
# The web app manifest (the page pinned on a phone's home screen) has no type in WhiteNoise's list.
WHITENOISE_MIMETYPES = {".webmanifest": "application/manifest+json"}
WHITENOISE_AUTOREFRESH = DEBUG

# The app's log lines: "plain" for people, "json" for machines (one object per line with every
# field, assistant/logs.py; each answer's "stream ended" line: docs/monitoring.md). Production
# writes JSON unless told otherwise.
LOG_FORMAT = env_str("CHATSITE_LOG_FORMAT").strip().lower() or (
    "json" if PROFILE == "production" else "plain"
)
if LOG_FORMAT not in {"plain", "json"}:
    raise ImproperlyConfigured(
        f"CHATSITE_LOG_FORMAT must be 'plain' or 'json', not {env_str('CHATSITE_LOG_FORMAT')!r}."
    )
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "assistant.logs.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "loggers": {
        "assistant": {
            "handlers": ["console"],
            "level": env_str("CHATSITE_LOG_LEVEL", "INFO"),
            # Daphne gives the root logger a handler of its own: once is enough.
            "propagate": False,
        },
        # A view that raised: its traceback in the same format as the app's (never in the
        # response, which is the JSON or page error of assistant/errors.py).
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}

# --- chatsite ---------------------------------------------------------------------------------

# Engines are backends, like Django's caches: an alias maps to a class path and its options.
# CHATSITE_ENGINE picks which backend the "default" alias uses.
_ENGINE_BACKENDS = {
    # The embedded model in the host's model process (python -m assistant.modelhost).
    "llamacpp": "assistant.engines.model_process.ModelProcessEngine",
    # The embedded model inside this worker: one copy per worker, and a crash in llama.cpp
    # takes the worker down with it. For development and tests only.
    "llamacpp-inprocess": "assistant.engines.llamacpp.LlamaCppEngine",
    # Any OpenAI-compatible server over HTTP: vLLM's `vllm serve` in production.
    "openai-http": "assistant.engines.openai_http.OpenAIHTTPEngine",
    "vllm-inprocess": "assistant.engines.vllm_inprocess.VLLMInProcessEngine",
    "scripted": "assistant.engines.scripted.ScriptedEngine",
}


def engine_config(prefix: str, default: str) -> dict[str, object]:
    """One engine alias from ``<prefix>ENGINE`` and its options from ``<prefix>...`` variables."""
    name = env_str(f"{prefix}ENGINE", default)
    if name not in _ENGINE_BACKENDS:
        raise ImproperlyConfigured(
            f"{prefix}ENGINE={name!r} is not one of {', '.join(_ENGINE_BACKENDS)}."
        )
    return {
        "BACKEND": _ENGINE_BACKENDS[name],
        "OPTIONS": {
            # llamacpp: the model process's socket (its own options are the next three)
            "SOCKET": env_str(f"{prefix}MODEL_SOCKET") or None,
            # llamacpp-inprocess
            "MODEL_PATH": env_str(f"{prefix}LLAMACPP_MODEL_PATH"),
            "N_THREADS": env_int(f"{prefix}LLAMACPP_THREADS", 0),
            "N_CTX": env_int(f"{prefix}LLAMACPP_N_CTX", 2048),
            # openai-http (vLLM's OpenAI-compatible server) and vllm-inprocess
            "BASE_URL": env_str(f"{prefix}VLLM_URL", "http://127.0.0.1:8100/v1"),
            "MODEL": env_str(f"{prefix}VLLM_MODEL", "HuggingFaceTB/SmolLM2-135M-Instruct"),
            "API_KEY": env_str(f"{prefix}VLLM_API_KEY"),
            # scripted
            "TTFT_MS": env_int(f"{prefix}SCRIPTED_TTFT_MS", 50),
            "ITL_MS": env_int(f"{prefix}SCRIPTED_ITL_MS", 20),
            "TOKENS": env_int(f"{prefix}SCRIPTED_TOKENS", 20),
            # The languages the model answers in (ISO 639-1: en, zh...). The page tells a student
            # whose language is not among them that the answers will be in another language.
            # The default model, SmolLM2-135M, answers in English whatever it is asked in.
            "LANGUAGES": env_list(f"{prefix}MODEL_LANGUAGES", "en"),
            # Streams one process runs on this engine at once; more get 503 at once (0: no cap).
            "MAX_STREAMS": env_int(f"{prefix}MAX_STREAMS", 256),
            # Sampling; unset means the backend's own default (GenerationParams in its module).
            "MAX_TOKENS": env_str(f"{prefix}MAX_TOKENS") or None,
            "TEMPERATURE": env_str(f"{prefix}TEMPERATURE") or None,
            "TOP_P": env_str(f"{prefix}TOP_P") or None,
            "REPEAT_PENALTY": env_str(f"{prefix}REPEAT_PENALTY") or None,
            "FREQUENCY_PENALTY": env_str(f"{prefix}FREQUENCY_PENALTY") or None,
            "PRESENCE_PENALTY": env_str(f"{prefix}PRESENCE_PENALTY") or None,
        },
    }


# CHATSITE_ENGINE picks the "default" alias's backend; CHATSITE_CANDIDATE_ENGINE (with options
# named CHATSITE_CANDIDATE_VLLM_URL and so on) adds a "candidate" alias to A/B two engines.
CHATSITE_ENGINES = {"default": engine_config("CHATSITE_", "llamacpp")}
if env_str("CHATSITE_CANDIDATE_ENGINE"):
    CHATSITE_ENGINES["candidate"] = engine_config("CHATSITE_CANDIDATE_", "")

# Two serving paths with one protocol: "direct" (a Channels consumer, raw ASGI sends) and
# "django" (an async view through the middleware stack). /api/chat/stream sends a sticky share
# of sessions to the candidate; a circuit breaker sends everyone back to the baseline when the
# candidate is slower or fails more. Staff change the share on the dashboard (stored in the
# database); CANDIDATE_PERCENT is the share until they do.
CHATSITE_SERVING = {
    "ENGINES": {
        "direct": env_str("CHATSITE_DIRECT_ENGINE_ALIAS", "default"),
        "django": env_str("CHATSITE_DJANGO_ENGINE_ALIAS", "default"),
    },
    "BASELINE": env_str("CHATSITE_BASELINE_PATH", "direct"),
    "CANDIDATE": env_str("CHATSITE_CANDIDATE_PATH", "django"),
    "CANDIDATE_PERCENT": float(env_str("CHATSITE_CANDIDATE_PERCENT", "0")),
    # Seconds between re-reads of the shared split in each process.
    "REFRESH_S": float(env_str("CHATSITE_SPLIT_REFRESH_S", "1")),
}
if {CHATSITE_SERVING["BASELINE"], CHATSITE_SERVING["CANDIDATE"]} != {"direct", "django"}:
    raise ImproperlyConfigured(
        "CHATSITE_BASELINE_PATH and CHATSITE_CANDIDATE_PATH must be 'direct' and 'django'."
    )

CHATSITE_BREAKER = {
    "WINDOW_S": float(env_str("CHATSITE_BREAKER_WINDOW_S", "300")),
    # Fewer samples than this on either side: no verdict, whatever the figures say.
    "MIN_SAMPLES": env_int("CHATSITE_BREAKER_MIN_SAMPLES", 50),
    # Trip when the candidate's P95 server TTFT exceeds this times the baseline's...
    "P95_RATIO": float(env_str("CHATSITE_BREAKER_P95_RATIO", "1.2")),
    # ... or its error rate exceeds the baseline's by this much (0.05 = 5 points).
    "ERROR_MARGIN": float(env_str("CHATSITE_BREAKER_ERROR_MARGIN", "0.05")),
    "COOLDOWN_S": float(env_str("CHATSITE_BREAKER_COOLDOWN_S", "120")),
    # While half-open, this share (at most the configured one) tries the candidate again.
    "HALF_OPEN_PERCENT": float(env_str("CHATSITE_BREAKER_HALF_OPEN_PERCENT", "5")),
    "HALF_OPEN_SAMPLES": env_int("CHATSITE_BREAKER_HALF_OPEN_SAMPLES", 20),
    "EVALUATE_S": float(env_str("CHATSITE_BREAKER_EVALUATE_S", "2")),
}

# Who a request comes from, and what one address may do. Behind nginx the address is the one
# nginx saw (X-Forwarded-For / X-Real-IP), believed only from TRUSTED_PROXIES. A school puts a
# whole class behind one NAT address: the defaults let 120 students share one (docs/deploy.md).
CHATSITE_CLIENTS = {
    "TRUSTED_PROXIES": env_list("CHATSITE_TRUSTED_PROXIES", "127.0.0.1,::1"),
    # New sessions (first visits to the page) one address may start per minute; 0: no limit.
    "NEW_SESSIONS_PER_MINUTE": env_int("CHATSITE_NEW_SESSIONS_PER_MINUTE", 120),
    # Answers one address may have streaming at once, per worker and engine; 0: no limit.
    "STREAMS_PER_ADDRESS": env_int("CHATSITE_STREAMS_PER_ADDRESS", 120),
    # Seconds a request may take to arrive whole, headers and body (python -m chatsite.server);
    # 0: no limit. Behind nginx, nginx reads the body first.
    "REQUEST_TIMEOUT_S": float(env_str("CHATSITE_REQUEST_TIMEOUT_S", "10")),
    # Connections the kernel holds for a worker before it accepts them (python -m chatsite.server;
    # Twisted's own is 50, which a burst through nginx overflows). Capped by net.core.somaxconn.
    "LISTEN_BACKLOG": env_int("CHATSITE_LISTEN_BACKLOG", 2048),
}

# Failed password logins before the username, or the address, is locked for LOCKOUT_S
# (counted over the same span); 0: no limit. Schools' staff may share one address.
CHATSITE_LOGIN_LIMITS = {
    "FAILURES_PER_ACCOUNT": env_int("CHATSITE_LOGIN_FAILURES_PER_ACCOUNT", 5),
    "FAILURES_PER_ADDRESS": env_int("CHATSITE_LOGIN_FAILURES_PER_ADDRESS", 30),
    "LOCKOUT_S": env_int("CHATSITE_LOGIN_LOCKOUT_S", 900),
}

# The bounds a teacher's class settings stay within (services/teaching.py).
CHATSITE_CLASS_BOUNDS = {
    "TEMPERATURE_MAX": float(env_str("CHATSITE_CLASS_TEMPERATURE_MAX", "1.5")),
    "MAX_TOKENS_MAX": env_int("CHATSITE_CLASS_MAX_TOKENS_MAX", 1024),
    "CHAT_RATE_MAX": env_int("CHATSITE_CLASS_CHAT_RATE_MAX", 120),
}

# The OpenAI-compatible API (/v1/, docs/operators.md).
CHATSITE_API = {
    # The model id /v1/models lists and requests name; the split picks the engine behind it.
    "MODEL": env_str("CHATSITE_API_MODEL", "chatsite"),
    # Requests per minute per key, unless the key sets its own.
    "RATE": env_int("CHATSITE_API_RATE", 600),
    # A request carries its whole conversation: more room than the page's one question.
    "MAX_BODY_BYTES": env_int("CHATSITE_API_MAX_BODY_BYTES", 256 * 1024),
    "MAX_MESSAGES": env_int("CHATSITE_API_MAX_MESSAGES", 64),
}

# (requests, seconds) per session or user.
CHATSITE_RATE_LIMITS = {
    "beacon": (env_int("CHATSITE_BEACON_RATE", 120), 60),
    "chat": (env_int("CHATSITE_CHAT_RATE", 30), 60),
}

# How long measurements are kept: `manage.py prune` (daily, deploy/systemd/chatsite-prune.timer)
# deletes stream records and breaker events older than this (0: none), and expired sessions.
# A school year by default: a class's CSV export and questions page are read from the records.
# The students' conversations are theirs, and are kept.
CHATSITE_RETENTION = {"RECORDS_DAYS": env_int("CHATSITE_RECORDS_KEEP_DAYS", 365)}

# Seconds between two checks, on the staff dashboard's live stream, that its viewer is still
# staff: an account demoted or deactivated stops receiving figures within this.
CHATSITE_DASHBOARD = {"STAFF_RECHECK_S": float(env_str("CHATSITE_DASHBOARD_RECHECK_S", "30"))}

CHATSITE_STREAM = {
    # Seconds of silence after which a ": ping" comment keeps proxies and the page's watchdog happy.
    "PING_INTERVAL": float(env_str("CHATSITE_PING_INTERVAL", "15")),
    "MAX_MESSAGE_CHARS": env_int("CHATSITE_MAX_MESSAGE_CHARS", 4000),
    "MAX_BODY_BYTES": env_int("CHATSITE_MAX_BODY_BYTES", 32 * 1024),
    "HISTORY_MESSAGES": env_int("CHATSITE_HISTORY_MESSAGES", 12),
    # Answers one session (or user) may have streaming at once; 0 for no limit.
    "STREAMS_PER_SESSION": env_int("CHATSITE_STREAMS_PER_SESSION", 1),
    # Seconds the engine may take to its first token, and between two tokens.
    "FIRST_TOKEN_TIMEOUT": float(env_str("CHATSITE_FIRST_TOKEN_TIMEOUT", "60")),
    "TOKEN_TIMEOUT": float(env_str("CHATSITE_TOKEN_TIMEOUT", "30")),
    # Seconds to keep retrying a write while the database is unreachable (answers are kept in
    # memory meanwhile); after that the loss is logged and counted.
    "PERSIST_RETRY_S": float(env_str("CHATSITE_PERSIST_RETRY_S", "120")),
    # With at least PERSIST_BATCH_FROM answers running in a worker, its writer stores what was
    # said at most once every PERSIST_BATCH_MS milliseconds (0: as soon as it can), so that many
    # answers share each transaction; with fewer, at once.
    "PERSIST_BATCH_MS": float(env_str("CHATSITE_PERSIST_BATCH_MS", "50")),
    "PERSIST_BATCH_FROM": env_int("CHATSITE_PERSIST_BATCH_FROM", 16),
    # Bytes of a stream the client may leave unread (in the server's and the kernel's buffers)
    # before the stream is ended as too slow: a reader that stalls cannot pin memory.
    "MAX_UNSENT_BYTES": env_int("CHATSITE_MAX_UNSENT_BYTES", 256 * 1024),
    # Seconds an answer goes on after its client vanished, for the page to resume it (0: off);
    # how long a finished one stays resumable; the most kept per stream.
    "RESUME_GRACE_S": float(env_str("CHATSITE_RESUME_GRACE_S", "30")),
    "RESUME_KEEP_S": float(env_str("CHATSITE_RESUME_KEEP_S", "60")),
    "RESUME_MAX_BYTES": env_int("CHATSITE_RESUME_MAX_BYTES", 256 * 1024),
    # Seconds a worker asked to stop (SIGTERM) keeps serving the requests it has open, having
    # stopped accepting new ones, before it stops anyway (python -m chatsite.server).
    "DRAIN_S": float(env_str("CHATSITE_DRAIN_S", "25")),
    "SYSTEM_PROMPT": env_str(
        "CHATSITE_SYSTEM_PROMPT",
        "You are a patient, friendly teaching assistant. Answer clearly and briefly.",
    ),
}
