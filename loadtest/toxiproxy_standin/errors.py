"""Errors the API reports, in Toxiproxy's words and status codes."""

from __future__ import annotations

from typing import NoReturn


class ApiError(Exception):
    """An error the HTTP API reports as ``{"error": message, "status": status}``.

    As in Toxiproxy, where any error that is not one of its own API errors
    (a listen failure, say) is a 500 with the error's text.
    """

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def bad_request(detail: str) -> ApiError:
    return ApiError(f"bad request body: {detail}", 400)


def internal_error(detail: str) -> ApiError:
    return ApiError(detail, 500)


def missing_field(detail: str) -> ApiError:
    return ApiError(f"missing required field: {detail}", 400)


PROXY_NOT_FOUND = ("proxy not found", 404)
PROXY_EXISTS = ("proxy already exists", 409)
TOXIC_NOT_FOUND = ("toxic not found", 404)
TOXIC_EXISTS = ("toxic already exists", 409)
INVALID_STREAM = ("stream was invalid, can be either upstream or downstream", 400)
INVALID_TOXIC_TYPE = ("invalid toxic type", 400)


def fail(error: tuple[str, int]) -> NoReturn:
    raise ApiError(*error)
