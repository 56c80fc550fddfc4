"""Posting an admin change form as an operator would."""

from __future__ import annotations

from django.db.models import Model
from django.urls import reverse


def edit_in_the_admin(client, row: Model, **changed) -> None:
    """POST `row`'s admin change form as the page shows it, with `changed` values."""
    url = reverse(f"admin:pipeline_{row._meta.model_name}_change", args=[row.pk])
    form = client.get(url).context["adminform"].form
    data: dict = {}
    for name, field in form.fields.items():
        value = form[name].value()
        if hasattr(field.widget, "widgets"):  # a date and a time
            data.update({f"{name}_{i}": part or "" for i, part in enumerate(field.widget.decompress(value))})
        elif value is not None and value is not False:
            data[name] = "on" if value is True else value
    data.update({name: value for name, value in changed.items() if value is not False})
    for name in [name for name, value in changed.items() if value is False]:
        data.pop(name, None)  # an unticked box is not sent
    response = client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
