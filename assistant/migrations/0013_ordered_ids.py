import django.db.models
from django.db import migrations

import assistant.ids


def _id_field() -> django.db.models.UUIDField:
    return django.db.models.UUIDField(
        default=assistant.ids.ordered_uuid,
        editable=False,
        primary_key=True,
        serialize=False,
    )


class Migration(migrations.Migration):
    """Conversations and messages take version 7 ids (``assistant.ids.ordered_uuid``) when made
    without one. The default is Python's, never the database's: nothing changes in the tables
    (SQLite would otherwise copy both to alter a column that stays as it is)."""

    dependencies = [
        ("assistant", "0012_streamrecord_server"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(model_name="conversation", name="id", field=_id_field()),
                migrations.AlterField(model_name="message", name="id", field=_id_field()),
            ],
            database_operations=[],
        )
    ]
