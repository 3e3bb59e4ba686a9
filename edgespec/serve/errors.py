"""The server's errors in OpenAI's shape: :class:`ApiError`, and what turns a request
body's pydantic validation error into the 400 that names the field at fault."""

from __future__ import annotations

from pydantic import ValidationError
from pydantic_core import PydanticCustomError


class ApiError(Exception):
    """An error response: HTTP status and OpenAI's ``{"error": {...}}`` body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> dict:
        """OpenAI's error body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def invalid(message: str, param: str | None = None) -> PydanticCustomError:
    """What a field's validator raises: what is wrong (``must be true or false``), or,
    naming the field at fault itself (``prediction.content`` from ``prediction``'s
    validator), the whole sentence."""
    return PydanticCustomError("invalid", message, {"param": param} if param else None)


def bad_request(error: ValidationError) -> ApiError:
    """A body's first error as a 400 naming its field: pydantic checks the fields in
    the order the model declares them, and says where it met the error
    (``messages[0].role``), unless the validator named the field itself."""
    first = error.errors(include_url=False)[0]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"]).lstrip(".")
    named = (first.get("ctx") or {}).get("param")
    if first["type"] == "value_error":  # edgespec's own checks (SamplingParams') name the field
        message = str(first["ctx"]["error"])
    elif named:
        message = first["msg"]
    elif first["type"] == "invalid":  # ours: "must be true or false", said of the field
        message = f"{where} {first['msg']}"
    elif first["type"] == "model_type":
        message = f"{where or 'the request body'} must be a JSON object"
    else:  # pydantic's: "Input should be a valid boolean"
        message = f"{where}: {first['msg']}"
    return ApiError(400, message, param=named or where or None)
