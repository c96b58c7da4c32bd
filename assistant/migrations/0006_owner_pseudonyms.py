"""Owner keys name anonymous sessions by a keyed hash of their key, no longer by the key itself.

Rows written before held ``session:<the sessionid cookie value>``: anyone who could read them (the
admin lists and searches owner keys) could set that value as their own cookie and continue the
student's conversations. This rewrites them as ``services.identity.owner_key_for`` now does
(HMAC-SHA256 under SECRET_KEY, the same salt), so the students keep their history.
"""

from django.db import migrations
from django.utils.crypto import salted_hmac

#: As in assistant/services/identity.py at the time of writing; a migration keeps its own copy.
OWNER_SALT = "chatsite.identity.owner-key"
#: "session:" and 64 hex digits: already a pseudonym.
PSEUDONYM_LENGTH = len("session:") + 64


def _pseudonym(owner_key: str) -> str:
    session_key = owner_key.removeprefix("session:")
    digest = salted_hmac(OWNER_SALT, session_key, algorithm="sha256").hexdigest()
    return f"session:{digest}"


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    for name in ("Conversation", "StreamRecord"):
        model = apps.get_model("assistant", name)
        rows = model.objects.filter(owner_key__startswith="session:").only("pk", "owner_key")
        batch = []
        for row in rows.iterator(chunk_size=2000):
            if len(row.owner_key) == PSEUDONYM_LENGTH:
                continue
            row.owner_key = _pseudonym(row.owner_key)
            batch.append(row)
            if len(batch) >= 2000:
                model.objects.bulk_update(batch, ["owner_key"])
                batch = []
        if batch:
            model.objects.bulk_update(batch, ["owner_key"])


class Migration(migrations.Migration):
    dependencies = [("assistant", "0005_given_up")]

    # A hash cannot be turned back into the key: going back leaves the pseudonyms in place.
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
