"""Teachers and the classes they run: who may see which class, and the changes they make.

A teacher is a user with the ``assistant.teach`` permission (the "Teachers" group has it), not
staff: they run their own classes and see nothing else. Admins (staff) see every class. A class
somebody may not see does not exist for them: ``class_visible`` raises ``Http404``, the same
answer an unknown id gets.
"""

import uuid
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import transaction
from django.db.models import Count, Q, QuerySet
from django.http import Http404

from assistant.models import ClassMember, Classroom
from assistant.services.classrooms import join_code_new
from assistant.services.identity import owner_key_for, session_user

TEACHERS_GROUP = "Teachers"
TEACH_PERMISSION = "assistant.teach"


def is_admin(user: Any) -> bool:
    """Staff: every class, the A/B split and the breaker."""
    return bool(user.is_authenticated and user.is_active and user.is_staff)


def staff_of_session(session_key: str) -> str | None:
    """Synchronous (session store, ORM): ``user:<id>`` when the session is an active staff
    member's now (logged in, session still valid, still staff), else None."""
    user, _session = session_user(session_key)
    return owner_key_for(user, session_key) if is_admin(user) else None


def is_teacher(user: Any) -> bool:
    """May run classes: a teacher, or an admin."""
    return bool(
        user.is_authenticated
        and user.is_active
        and (user.is_staff or user.has_perm(TEACH_PERMISSION))
    )


def classes_visible(user: Any) -> QuerySet[Classroom]:
    """The classes ``user`` may see and manage: all for an admin, their own for a teacher,
    none for anybody else."""
    if is_admin(user):
        return Classroom.objects.all()
    if is_teacher(user):
        return Classroom.objects.filter(teachers=user)
    return Classroom.objects.none()


def class_visible(user: Any, classroom_id: uuid.UUID | str) -> Classroom:
    """One class ``user`` may see; ``Http404`` for any other, as for an unknown id."""
    try:
        return classes_visible(user).get(id=classroom_id)
    except (Classroom.DoesNotExist, ValueError):
        raise Http404("No such class") from None


def teachers_group() -> Group:
    """The "Teachers" group, with the permission to run classes."""
    group, _ = Group.objects.get_or_create(name=TEACHERS_GROUP)
    app_label, codename = TEACH_PERMISSION.split(".")
    permission = Permission.objects.get(content_type__app_label=app_label, codename=codename)
    group.permissions.add(permission)
    return group


@transaction.atomic
def teacher_create(*, username: str, password: str | None, email: str = "") -> Any:
    """A new teacher account (not staff); without ``password`` it cannot log in until an admin
    sets one."""
    user = get_user_model().objects.create_user(username=username, email=email, password=password)
    user.groups.add(teachers_group())
    return user


@transaction.atomic
def class_create(*, name: str, teacher: Any, **fields: Any) -> Classroom:
    """A new class with a fresh join code, run by ``teacher``."""
    classroom = Classroom.objects.create(name=name, join_code=join_code_new(), **fields)
    classroom.teachers.add(teacher)
    return classroom


def class_pause(classroom: Classroom, *, paused: bool) -> None:
    """Pause the class (students get a message and no answer) or open it again."""
    classroom.paused = paused
    classroom.save(update_fields=["paused", "updated_at"])


def class_members(classroom: Classroom) -> QuerySet[ClassMember]:
    """The students in the class now, by when they joined."""
    return classroom.members.filter(left_at__isnull=True)


def class_bounds() -> dict[str, float]:
    """The limits an admin sets on a class's sampling (``CHATSITE_CLASS_BOUNDS``)."""
    return dict(settings.CHATSITE_CLASS_BOUNDS)


#: The class settings a teacher may change on the class page (``class_settings_change``).
CLASS_SETTINGS = (
    "name",
    "persona",
    "temperature",
    "max_tokens",
    "engine_alias",
    "chat_rate",
    "teachers_read",
    "code_expires_at",
)


def classes_listed(user: Any) -> QuerySet[Classroom]:
    """``classes_visible`` for the teacher's list, by name, each with ``students``: how many
    are in it now."""
    in_class = Count("members", filter=Q(members__left_at__isnull=True))
    return classes_visible(user).annotate(students=in_class).order_by("name", "created_at")


def class_settings_change(classroom: Classroom, **fields: Any) -> None:
    """Store the teacher's settings (already parsed within ``class_bounds``: see
    ``teach_forms.py``). The next question a student asks is answered with them: answers read
    the class's row with the session (``services/classrooms.py``)."""
    unknown = set(fields) - set(CLASS_SETTINGS)
    if unknown:
        raise TypeError(f"not class settings: {sorted(unknown)}")
    for name, value in fields.items():
        setattr(classroom, name, value)
    classroom.save(update_fields=[*fields, "updated_at"])
