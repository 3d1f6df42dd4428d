"""Errors the service raises for people: the CLI prints them as one line and exits non-zero."""


class BatchInferError(Exception):
    exit_code = 1


class JobNotFound(BatchInferError):
    exit_code = 3


class InvalidRequest(BatchInferError):
    exit_code = 2
