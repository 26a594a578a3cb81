"""Beat entries that outlive a reconfiguration of the app (docs/design.md §8).

Celery's ``add_periodic_task`` writes into ``app.conf.beat_schedule`` at once when the app is
configured, and a later ``config_from_object`` builds a new ``app.conf`` without it. An entry
kept here is written now (if the app is configured) and again after every configuration
(``app.on_after_configure``), which is when beat and workers read the schedule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery import Celery

__all__ = ["keep_beat_entry"]


def keep_beat_entry(app: Celery, key: str, entry: Mapping[str, Any]) -> None:
    """Put ``entry`` in ``app.conf.beat_schedule[key]`` now and after every configuration."""
    frozen = dict(entry)

    def install(**_: Any) -> None:
        app.conf.beat_schedule[key] = dict(frozen)

    app.on_after_configure.connect(install, weak=False)
    if app.configured:
        install()
