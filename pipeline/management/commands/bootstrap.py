"""First-run setup for `make run`: a local superuser, demo data in an empty database, and how to log in."""

from __future__ import annotations

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand

from pipeline.models import Conversation

ADMIN_USERNAME = "admin"


class Command(BaseCommand):
    help = "Create the local superuser on first run, load demo data into an empty database, print how to log in."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--url", default=f"http://127.0.0.1:{os.environ.get('PORT', '8000')}")
        parser.add_argument("--no-demo", action="store_true", help="Do not load demo data.")

    def handle(self, *args, url: str, no_demo: bool, **options) -> None:
        User = get_user_model()
        password = os.environ.get("CTXLENS_ADMIN_PASSWORD", "")
        if not User.objects.filter(is_superuser=True).exists():
            generated = not password
            password = password or secrets.token_urlsafe(12)
            User.objects.create_superuser(ADMIN_USERNAME, email="", password=password)
            shown = password if generated else "the password in CTXLENS_ADMIN_PASSWORD"
            login = f"Log in at {url}/ as '{ADMIN_USERNAME}' with password: {shown}"
            if generated:
                login += "\n(shown only this once; change it with `python manage.py changepassword admin`)"
        else:
            login = (
                f"Log in at {url}/ with your superuser (first run printed the password; "
                f"reset it with `.venv/bin/python manage.py changepassword {ADMIN_USERNAME}`)."
            )

        if not no_demo and not Conversation.objects.exists() and "demo_agent" in get_commands():
            self.stdout.write("Loading demo conversations (database is empty)...")
            call_command("demo_agent", stdout=self.stdout)

        self.stdout.write(self.style.SUCCESS(login))
