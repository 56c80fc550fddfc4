"""Posting an admin change form as an operator would."""

from __future__ import annotations

from django.db.models import Model
from django.urls import reverse


def edit_in_the_admin(client, row: Model, **changed) -> None:
    """POST `row`'s admin change form as the page shows it, with `changed` values."""
    url, data = change_form(client, row, **changed)
    response = client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors


def change_form(client, row: Model, **changed) -> tuple[str, dict]:
    """`row`'s admin change page and the data its form would POST, with `changed` values."""
    url = reverse(f"admin:pipeline_{row._meta.model_name}_change", args=[row.pk])
    form = client.get(url).context["adminform"].form
    data: dict = {}

    def put(name: str, field, value) -> None:
        if hasattr(field.widget, "widgets"):  # a date and a time
            data.update({f"{name}_{i}": part or "" for i, part in enumerate(field.widget.decompress(value))})
        elif value is not None and value is not False:  # an unticked box is not sent
            data[name] = "on" if value is True else value

    for name, field in form.fields.items():
        put(name, field, changed.get(name, form[name].value()))
        if field.show_hidden_initial:  # the page's hidden copy of a field with a callable default
            put(f"initial-{name}", field, form[name].value())
    data.update({name: value for name, value in changed.items() if name not in form.fields})  # the form ignores them
    return url, data
