# The overview's finding codes read only the conversations with findings (an index of those),
# instead of every conversation: a full scan on PostgreSQL and SQLite alike.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('pipeline', '0014_rollups'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='conversation',
            index=models.Index(condition=models.Q(('finding_count__gt', 0)), fields=['finding_count', 'last_activity_at'], name='conv_with_findings_idx'),
        ),
    ]
