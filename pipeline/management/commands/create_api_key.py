"""python manage.py create_api_key NAME [--scope ingest|read|all]: the new key alone on the last line."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from pipeline.models import ApiKey
from pipeline.models.apikeys import Scope


class Command(BaseCommand):
    help = "Create an API key. The key is printed once, alone on the last line; only its hash is stored."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")
        parser.add_argument("--scope", choices=[s.value for s in Scope], default=Scope.INGEST)

    def handle(self, *args, name: str, scope: str, **options) -> None:
        key, raw_key = ApiKey.generate(name=name, scope=scope)
        self.stderr.write(f"Created API key '{key.name}' with scope '{key.scope}'. Store it now; it is not shown again.")
        self.stdout.write(raw_key)
