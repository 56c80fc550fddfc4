# On PostgreSQL 14 to 18 built with LZ4, every text and JSON column of ctxlens's tables (the large
# ones hold trace content: span attributes, messages, tool observations) compresses the values it
# TOASTs (rows past ~2 KB) with LZ4 instead of pglz: PostgreSQL's CPU per span on the standard load
# 443 -> 412 µs, for about 8 % more disk (`bench/workers.py --workers 1`, run on this commit and on
# the one before it, back to back). PostgreSQL 19 already defaults to LZ4; without LZ4 (or before
# 14) nothing changes. Values already stored keep their compression until written again; a column
# added or retyped later takes the server's default (default_toast_compression), so its migration
# sets LZ4 the same way. SET COMPRESSION only changes the catalog, but takes each table's ACCESS
# EXCLUSIVE lock until the migration commits: run it before the workers start, as the README says.

from django.db import migrations

CONTENT_FIELDS = ("JSONField", "TextField")


def content_columns(apps):
    for model in apps.get_app_config("pipeline").get_models():
        for field in model._meta.concrete_fields:
            if field.get_internal_type() in CONTENT_FIELDS:
                yield model._meta.db_table, field.column


def lz4_available(connection) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
        row = cursor.fetchone()
    return bool(row and row[0])


def set_compression(apps, schema_editor, method: str) -> None:
    if schema_editor.connection.vendor != "postgresql" or not lz4_available(schema_editor.connection):
        return
    quote = schema_editor.quote_name
    for table, column in content_columns(apps):
        schema_editor.execute(f"ALTER TABLE {quote(table)} ALTER COLUMN {quote(column)} SET COMPRESSION {method}")


def compress_with_lz4(apps, schema_editor):
    set_compression(apps, schema_editor, "lz4")


def compress_by_default(apps, schema_editor):
    set_compression(apps, schema_editor, "default")


class Migration(migrations.Migration):

    dependencies = [
        ('pipeline', '0017_drop_prefix_indexes'),
    ]

    operations = [
        migrations.RunPython(compress_with_lz4, compress_by_default),
    ]
