"""What a transient fault is: the one definition every retry and resume decision uses."""
from __future__ import annotations

from batchinfer.db.session import is_transient_db


def is_transient(exc: BaseException) -> bool:
    """The database or storage unreachable for now (a dropped connection, a timeout, a restart, throttling):
    the same step may succeed later. A missing file, or any other error, is not that."""
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError
    from urllib3.exceptions import HTTPError

    if isinstance(exc, FileNotFoundError):
        return False
    return is_transient_db(exc) or isinstance(exc, (BotoCoreError, ClientError, S3UploadFailedError, HTTPError,
                                                    ConnectionError, TimeoutError))
