"""Finding API keys for the people who manage them: a class's keys for its teachers
(``teach_keys_views.py``), every key for an admin's command (``manage.py apikey``).

Making and revoking keys is ``services/api_keys.py``'s; this module only reads. A key of another
class does not exist for a class's page: ``class_key_visible`` raises ``Http404``, the same answer
an unknown id gets, as ``services/teaching.class_visible`` does for classes. Nothing here reads
or returns a key's digest to its callers' output: lists show ``key_shown``, the public part.
"""

import uuid

from django.db.models import QuerySet
from django.http import Http404

from assistant.models import ApiKey, Classroom
from assistant.services.api_keys import KEY_START, PREFIX_LENGTH


def key_shown(row: ApiKey) -> str:
    """How lists show a key: its public part, ``csk-<prefix>-…`` (the secret is never kept)."""
    return f"{KEY_START}{row.prefix}-…"


def class_keys(classroom: Classroom) -> QuerySet[ApiKey]:
    """``classroom``'s keys, active and revoked, newest first, with who created each."""
    return ApiKey.objects.filter(classroom=classroom).select_related("created_by")


def class_key_visible(classroom: Classroom, key_id: uuid.UUID | str) -> ApiKey:
    """One of ``classroom``'s keys; ``Http404`` for any other key, as for an unknown id."""
    try:
        return ApiKey.objects.get(id=key_id, classroom=classroom)
    except (ApiKey.DoesNotExist, ValueError):
        raise Http404("No such key") from None


def keys_listed() -> QuerySet[ApiKey]:
    """Every key of the site (the site's own and every class's), newest first."""
    return ApiKey.objects.select_related("classroom", "created_by")


def key_by_prefix(text: str) -> ApiKey:
    """The key whose prefix is ``text``, given bare (``abcdefghij``), as lists show it
    (``csk-abcdefghij-…``) or as the whole key; ``ApiKey.DoesNotExist`` for none."""
    text = text.strip()
    if text.startswith(KEY_START):
        text = text[len(KEY_START) : len(KEY_START) + PREFIX_LENGTH]
    return ApiKey.objects.get(prefix=text)
