"""What every service call needs: settings, a database session factory and the file storage."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sqlalchemy.orm import Session, sessionmaker

from batchinfer.db.session import session_factory, upgrade
from batchinfer.settings import Settings
from batchinfer.storage import Storage, open_storage


@dataclass
class AppContext:
    settings: Settings
    sessions: sessionmaker[Session]
    storage: Storage
    # model id -> checkpoint of what live workers serve (cluster.registry), set where a broker is: the job
    # system's layer cannot read the registry itself. None: the configuration's models only (embedded)
    live_models: Callable[[], dict[str, str | None]] | None = None

    @classmethod
    def create(cls, settings: Settings, migrate: bool | None = None) -> "AppContext":
        """migrate=None upgrades the schema automatically in embedded mode (no broker) or on SQLite."""
        url = settings.resolved_database_url
        if migrate is None:
            migrate = settings.embedded or url.startswith("sqlite")
        if migrate:
            upgrade(url)
        return cls(settings, session_factory(url), open_storage(settings.resolved_storage_url))
