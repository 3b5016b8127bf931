"""S3's error codes, each with the status S3 answers it with.

They are :class:`~protocol.errors.ProtocolError`\\ s, so a front end maps any of them
(and the rest of the tree, by status) to S3's XML error document in one place.
"""

from __future__ import annotations

from protocol.errors import ProtocolError


class S3Error(ProtocolError):
    """An error with an S3 error code (``<Code>``)."""

    code = "InvalidArgument"
    status_hint = 400
    title = "Bad Request"


class InvalidArgument(S3Error):
    code = "InvalidArgument"


class InvalidBucketName(S3Error):
    code = "InvalidBucketName"


class InvalidRequest(S3Error):
    code = "InvalidRequest"


class NoSuchKey(S3Error):
    code = "NoSuchKey"
    status_hint = 404
    title = "Not Found"


class NoSuchBucket(S3Error):
    code = "NoSuchBucket"
    status_hint = 404
    title = "Not Found"


class OperationNotImplemented(S3Error):
    code = "NotImplemented"
    status_hint = 501
    title = "Not Implemented"


class MethodNotAllowed(S3Error):
    code = "MethodNotAllowed"
    status_hint = 405
    title = "Method Not Allowed"


class AccessDenied(S3Error):
    code = "AccessDenied"
    status_hint = 403
    title = "Forbidden"
