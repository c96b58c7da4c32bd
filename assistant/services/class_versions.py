"""A class's version in Redis: how a worker's event loop knows that its own last read of a
class is still the stored one, without reading the database (``services/loop_admission.py``).

A class's version is its row's ``updated_at`` (which every change to a class sets, and which
the early engine start's guess is checked by), written as ``version_stamp`` gives it. Redis
holds one per class, beside the students' stream slots (``RedisSlots``):

* whoever changes a class writes its new version once the change is committed (``post_save``
  of ``Classroom``); a deleted class's becomes ``CLASS_GONE``;
* a question admitted on a database thread, having just read its class, keeps that read's
  version in Redis unless one is there already (``SET NX``, in the script that admits it): a
  read older than a change committed meanwhile never replaces the change's version;
* a question admitted on the event loop checks the version of the class this process read
  last against Redis's, in the same script, before anything is counted: when they differ (or
  Redis has none) the question is admitted on a thread, which reads the class again.

Each version lives a day (``CLASS_VERSION_TTL_MS``) from when it was written. On the local
profile (slots in this process's memory) nothing is written: questions of a class are admitted
on a thread there.
"""

import calendar
import functools
import logging
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete, post_save

from assistant.models import Classroom
from assistant.services.classrooms import ClassContext
from assistant.services.stream_slots import CLASS_GONE, ClassVersion, RedisSlots, slot_store

logger = logging.getLogger(__name__)


def version_stamp(moment: datetime) -> str:
    """``moment`` (a class's ``updated_at``) as its version: seconds and microseconds since the
    epoch, the same for the value a save set and the one read back from the database."""
    return f"{calendar.timegm(moment.utctimetuple())}.{moment.microsecond:06d}"


def class_version(context: ClassContext | None, *, check: bool) -> ClassVersion | None:
    """The version a question's try for a slot goes with (``ClassVersion``): None without a
    class."""
    if context is None:
        return None
    return ClassVersion(str(context.id), version_stamp(context.version), check=check)


def _saved(sender: type[Classroom], instance: Classroom, using: str, **kwargs: Any) -> None:
    _write_on_commit(str(instance.pk), version_stamp(instance.updated_at), using)


def _deleted(sender: type[Classroom], instance: Classroom, using: str, **kwargs: Any) -> None:
    _write_on_commit(str(instance.pk), CLASS_GONE, using)


def _write_on_commit(class_id: str, version: str, using: str) -> None:
    store = slot_store()
    if isinstance(store, RedisSlots):
        transaction.on_commit(functools.partial(_write, store, class_id, version), using=using)


def _write(store: RedisSlots, class_id: str, version: str) -> None:
    try:
        store.class_version_set(class_id, version)
    except Exception:
        # The change is stored; a worker may answer from its older read of the class until
        # the version in Redis lapses (a day) or the class changes again.
        logger.exception("Could not write the version of class %s to Redis", class_id)


def class_versions_connect() -> None:
    """Write a class's version whenever it is saved or deleted (``AssistantConfig.ready``)."""
    post_save.connect(_saved, sender=Classroom, dispatch_uid="chatsite-class-version-saved")
    post_delete.connect(_deleted, sender=Classroom, dispatch_uid="chatsite-class-version-deleted")
