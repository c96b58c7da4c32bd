"""A request id names one stream: unique among records of streams (those with an answer
message), not among requests refused before their stream started, which nginx sends on to the
baseline under the same id."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('assistant', '0006_owner_pseudonyms'),
    ]

    operations = [
        migrations.AlterField(
            model_name='streamrecord',
            name='request_id',
            field=models.CharField(db_index=True, max_length=64),
        ),
        migrations.AddConstraint(
            model_name='streamrecord',
            constraint=models.UniqueConstraint(condition=models.Q(('message_id__isnull', False)), fields=('request_id',), name='stream_record_one_stream_per_request_id'),
        ),
    ]
