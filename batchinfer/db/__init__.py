"""Database models and sessions."""
from batchinfer.db.models import Base, Job, JobStatus, Request, RequestStatus, UnitStatus, WorkUnit
from batchinfer.db.session import session_factory, transaction, upgrade

__all__ = ["Base", "Job", "JobStatus", "Request", "RequestStatus", "UnitStatus", "WorkUnit",
           "session_factory", "transaction", "upgrade"]
