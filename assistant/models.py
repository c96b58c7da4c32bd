"""Conversations belong to an owner: a logged-in user ("user:<id>") or a browser session
("session:<a keyed hash of its key>", ``services.identity.owner_key_for``: never the key, which
would work as the student's cookie). Nobody else can read or continue them."""

import uuid
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from assistant.ids import ordered_uuid


class Classroom(models.Model):
    """A teacher's class: students join it with its code (no account), and it sets the persona,
    the sampling and the limits their answers get (``services/classrooms.py``)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=80)
    teachers = models.ManyToManyField(
        settings.AUTH_USER_MODEL, related_name="classrooms", blank=True
    )
    #: What students type or open (``/c/<code>``); rotating it makes the old one stop working.
    join_code = models.CharField(max_length=16, unique=True)
    #: After this the code stops working (students already in stay in); null: never.
    code_expires_at = models.DateTimeField(null=True, blank=True)
    #: While paused, students get a message and no answer.
    paused = models.BooleanField(default=False)
    #: The system prompt its answers start from; empty: the site's (``CHATSITE_SYSTEM_PROMPT``).
    persona = models.TextField(blank=True)
    #: Sampling within the bounds the site sets (``CHATSITE_CLASS_BOUNDS``); null: the engine's.
    temperature = models.FloatField(null=True, blank=True)
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    #: The engine alias that answers (one of ``CHATSITE_ENGINES``); empty: the serving path's.
    engine_alias = models.CharField(max_length=32, blank=True)
    #: Questions per minute per student; null: the site's (``CHATSITE_CHAT_RATE``).
    chat_rate = models.PositiveIntegerField(null=True, blank=True)
    #: Whether the class's teachers may read its questions and answers (students are told).
    teachers_read = models.BooleanField(default=False)
    #: Since when they may (set by ``save``): questions asked before, when students were told
    #: otherwise, stay unread.
    teachers_read_since = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        permissions = [("teach", "Can run classes")]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Keep ``teachers_read_since`` with ``teachers_read``: none while reading is off; when
        it is turned on, the time it was committed (a question accepted meanwhile under the
        old promise arrived before it), stamped once the change is committed."""
        turned_on = self.teachers_read and self.teachers_read_since is None
        if not self.teachers_read:
            self.teachers_read_since = None
        update_fields = kwargs.get("update_fields")
        if update_fields is not None and "teachers_read" in update_fields:
            kwargs["update_fields"] = {*update_fields, "teachers_read_since"}
        super().save(*args, **kwargs)
        if turned_on:
            transaction.on_commit(self._reading_stamp)

    def _reading_stamp(self) -> None:
        stamp = timezone.now()
        Classroom.objects.filter(
            pk=self.pk, teachers_read=True, teachers_read_since__isnull=True
        ).update(teachers_read_since=stamp)
        self.teachers_read_since = stamp


class ClassMember(models.Model):
    """A student's membership of a class: their owner key and the nickname the teacher sees."""

    classroom = models.ForeignKey(Classroom, on_delete=models.CASCADE, related_name="members")
    owner_key = models.CharField(max_length=80)
    nickname = models.CharField(max_length=40, blank=True)
    joined_at = models.DateTimeField(auto_now_add=True)
    left_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["joined_at"]
        indexes = [models.Index(fields=["classroom", "owner_key"])]

    def __str__(self) -> str:
        return self.nickname or self.owner_key[:16]


class Conversation(models.Model):
    id = models.UUIDField(primary_key=True, default=ordered_uuid, editable=False)
    owner_key = models.CharField(max_length=80)
    #: The class its student was in when it began; null: none (and every conversation from
    #: before classes existed).
    classroom = models.ForeignKey(
        Classroom, null=True, blank=True, on_delete=models.SET_NULL, related_name="conversations"
    )
    title = models.CharField(max_length=120, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["-updated_at"]
        # Indexes named here rather than ``db_index=True``, with which PostgreSQL would keep a
        # second index per text column for ``LIKE 'prefix%'``, which nothing asks.
        indexes = [models.Index(fields=["owner_key"], name="conversation_owner_key")]

    def __str__(self) -> str:
        return self.title or str(self.id)


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"

    class Status(models.TextChoices):
        COMPLETE = "complete"
        # The stream ended early: the student left, the engine failed, the server stopped.
        PARTIAL = "partial"
        FAILED = "failed"

    id = models.UUIDField(primary_key=True, default=ordered_uuid, editable=False)
    #: Indexed by (conversation, created_at) below, which serves lookups by conversation too.
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages", db_index=False
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COMPLETE)
    finish_reason = models.CharField(max_length=32, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    #: When the student edited this question, or one before it, or asked for this answer again:
    #: the message stays stored, but neither the page nor the model sees it any more.
    replaced_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [
            models.Index(fields=["conversation", "created_at"]),
            models.Index(fields=["request_id"], name="message_request_id"),
        ]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:40]}"


class StreamRecord(models.Model):
    """One chat stream's measurements: the server's stage timings, joined later with what the
    browser measured. Written once the stream has ended, never on the path to the first token."""

    class Outcome(models.TextChoices):
        OK = "ok"
        CLIENT_ABORT = "client_abort"
        ENGINE_ERROR = "engine_error"
        TIMEOUT = "timeout"
        SERVER_ERROR = "server_error"
        #: The client stopped reading; the stream was dropped rather than buffered without end.
        SLOW_CLIENT = "slow_client"
        #: Stopped to let another request onto a full engine (error_code: unheard, fair_share).
        GIVEN_UP = "given_up"

    #: One stream per request id (a unique constraint below); requests refused before their
    #: stream started (no message) may share it: nginx sends a refused request on, same id.
    request_id = models.CharField(max_length=64)
    created_at = models.DateTimeField(db_index=True, help_text="When the request arrived.")
    #: Not indexed: nothing looks records up by their owner.
    owner_key = models.CharField(max_length=80)
    #: The asker's class (no key: a record outlives its class); null: none.
    classroom_id = models.UUIDField(null=True, blank=True)
    path = models.CharField(max_length=16)
    engine = models.CharField(max_length=32)
    #: The HTTP server of the worker that served it (``assistant/worker.py``); "": not named.
    server = models.CharField(max_length=16, blank=True, default="")
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    error_code = models.CharField(max_length=32, blank=True)
    conversation_id = models.UUIDField(null=True)
    message_id = models.UUIDField(null=True)
    tokens = models.PositiveIntegerField(default=0)
    # Server stages, milliseconds since the request arrived at the application.
    parse_ms = models.FloatField(null=True, help_text="Body validated, CSRF checked.")
    queue_ms = models.FloatField(null=True, help_text="Parsed to handed to the engine.")
    engine_ttft_ms = models.FloatField(null=True, help_text="Engine submit to its first delta.")
    server_ttft_ms = models.FloatField(null=True, help_text="Received to first token sent.")
    itl_mean_ms = models.FloatField(null=True)
    itl_max_ms = models.FloatField(null=True)
    e2e_ms = models.FloatField(null=True, help_text="Received to last frame.")
    # The browser's view, from its beacon (performance.now(), since fetch was called).
    client_outcome = models.CharField(max_length=16, blank=True)
    client_ttfb_ms = models.FloatField(null=True)
    client_ttft_ms = models.FloatField(null=True)
    client_done_ms = models.FloatField(null=True)
    client_waited_ms = models.FloatField(null=True, help_text="Time waited before giving up.")
    client_tokens = models.PositiveIntegerField(null=True)
    client_itl_mean_ms = models.FloatField(null=True)
    client_itl_max_ms = models.FloatField(null=True)
    # Buffering detector: how spread out the tokens were when sent and when they arrived.
    server_span_ms = models.FloatField(null=True, help_text="First to last token sent.")
    server_burst_gaps = models.PositiveIntegerField(
        null=True, help_text="Gaps between tokens sent under 2 ms."
    )
    client_span_ms = models.FloatField(null=True, help_text="First to last token arrived.")
    client_burst_gaps = models.PositiveIntegerField(
        null=True, help_text="Gaps between tokens arrived under 2 ms."
    )
    buffered = models.BooleanField(
        null=True, help_text="Sent spread out, arrived in bursts: something held the stream."
    )
    client_reported_at = models.DateTimeField(null=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["path", "created_at"]),
            models.Index(fields=["classroom_id", "created_at"]),
            models.Index(fields=["request_id"], name="stream_record_request_id"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["request_id"],
                condition=models.Q(message_id__isnull=False),
                name="stream_record_one_stream_per_request_id",
            )
        ]

    def __str__(self) -> str:
        return f"{self.request_id} {self.path} {self.outcome}"


class TrafficSum(models.Model):
    """One minute's or one hour's stream records, summed up per path (and per worker server,
    under "server:" and its name) for the dashboard's long windows
    (``services/traffic_sums.py``): {path: {requests, errors, abandoned, buffered,
    buffered_checked, server and client TTFT fine-bin counts, slowest (TTFT, pk)}}. A span
    without records is stored too ({}), so that it is never summed up again."""

    start = models.DateTimeField(help_text="The span's start (UTC).")
    span_s = models.PositiveIntegerField(help_text="60 or 3600.")
    paths = models.JSONField(default=dict)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["span_s", "start"], name="traffic_sum_one_per_span")
        ]

    def __str__(self) -> str:
        return f"{self.start:%Y-%m-%d %H:%M} +{self.span_s}s ({len(self.paths)} paths)"


class ApiKey(models.Model):
    """A bearer key for the OpenAI-compatible API (``/v1/``): created by an admin (for the
    site, or for a class) or by a teacher for their class, shown once, stored only as a hash
    (``services/api_keys.py``). A class's key answers with the class's persona and settings."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=80)
    #: The key's public part, shown in lists and logs, and how it is found.
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    #: SHA-256 of the whole key, hex: the key itself is never stored.
    digest = models.CharField(max_length=64, editable=False)
    #: The class it answers for; null: the site (admins only). Deleting the class ends it.
    classroom = models.ForeignKey(
        Classroom, null=True, blank=True, on_delete=models.CASCADE, related_name="api_keys"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    #: Requests per minute; null: the site's (``CHATSITE_API_RATE``).
    rate = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    #: When it was revoked: refused from the next request on.
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class ClassLoad(models.Model):
    """What one worker process is answering for classes right now, published every few seconds
    while it answers any (``services/class_live.py``); the teacher's dashboard adds up the rows
    that are fresh."""

    worker = models.CharField(max_length=120, unique=True)
    updated_at = models.DateTimeField(db_index=True)
    #: {class id: {"streaming": n, "waiting": n, "students": [owner key, ...]}}
    classes = models.JSONField(default=dict)

    def __str__(self) -> str:
        return f"{self.worker} {self.updated_at:%H:%M:%S}"


class ServingState(models.Model):
    """The A/B split and its circuit breaker: one row (pk=1), read by every process."""

    class Mode(models.TextChoices):
        AUTO = "auto"
        FORCE_BASELINE = "force_baseline"
        FORCE_CANDIDATE = "force_candidate"

    class Breaker(models.TextChoices):
        CLOSED = "closed"
        OPEN = "open"
        HALF_OPEN = "half_open"

    #: Share of students on the candidate path, 0-100; null: the settings' default.
    candidate_percent = models.FloatField(null=True, blank=True)
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.AUTO)
    breaker = models.CharField(max_length=16, choices=Breaker.choices, default=Breaker.CLOSED)
    #: When the breaker last changed state; null: never.
    breaker_since = models.DateTimeField(null=True, blank=True)
    #: When some process last evaluated the breaker (only one does per interval).
    evaluated_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=150, blank=True)

    def __str__(self) -> str:
        return f"{self.mode} {self.breaker} {self.candidate_percent}%"


class BreakerEvent(models.Model):
    """What changed the split: a trip with the figures that tripped it, a recovery, a person."""

    class Kind(models.TextChoices):
        TRIPPED = "tripped"
        HALF_OPEN = "half_open"
        CLOSED = "closed"
        REOPENED = "reopened"
        SPLIT_CHANGED = "split_changed"

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    breaker = models.CharField(max_length=16, choices=ServingState.Breaker.choices)
    message = models.CharField(max_length=300)
    figures = models.JSONField(default=dict, blank=True)
    actor = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.kind}: {self.message}"
