"""The one way kvjudge talks to S3 (boto3): a client with short timeouts and few retries, path-style addressing,
credentials from boto3's own chain (``AWS_*`` environment variables, ``~/.aws``, instance roles; read by boto3,
written nowhere by kvjudge), and one actionable line for each failure. The cold store (:mod:`.cold.s3`) and the
bucket ingest reads from (:mod:`.ingest.bucket`) share it."""

from __future__ import annotations

from typing import Any

#: Seconds to open a connection: an endpoint that is down fails in seconds, not minutes.
CONNECT_TIMEOUT = 5
_REFUSED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled", "Forbidden", "403"}


def make_s3_client(endpoint_url: str | None, *, max_attempts: int = 3, max_pool_connections: int = 16) -> Any:
    """A boto3 S3 client at ``endpoint_url`` (None: boto3's resolution, e.g. ``AWS_ENDPOINT_URL``)."""
    import boto3
    from botocore.config import Config as BotoConfig

    # Few retries and short timeouts: a server that is down must fail in seconds with a clear error, not hang a
    # command for minutes. Path-style addressing works with every S3-compatible server.
    config = BotoConfig(
        retries={"max_attempts": max_attempts, "mode": "standard"},
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=60,
        s3={"addressing_style": "path"},
        max_pool_connections=max_pool_connections,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    session = boto3.session.Session()
    region = session.region_name or "us-east-1"
    return session.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)


def s3_errors() -> tuple[type[Exception], ...]:
    """The exceptions a boto3 call raises for a failure of the request (not of kvjudge)."""
    from botocore.exceptions import BotoCoreError, ClientError

    return (BotoCoreError, ClientError)


def http_status(exc: Exception) -> int | None:
    """The HTTP status of a failed request, when the server answered."""
    response = getattr(exc, "response", None) or {}
    return response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def failure_line(exc: Exception, *, action: str, where: str, bucket: str, missing: str, server: str) -> str:
    """One line for a failed S3 request: ``action`` (``list``) at ``where`` (``s3://b/p at URL``); ``missing``
    says what to do when ``bucket`` does not exist, ``server`` what the server is called (``the cold store``)."""
    from botocore.exceptions import ClientError, NoCredentialsError, ParamValidationError

    if isinstance(exc, NoCredentialsError):
        return (f"no S3 credentials to {action} {where}; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                f"(or a profile in ~/.aws)")
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", "?"))
        if code == "NoSuchBucket":
            return f"bucket {bucket!r} does not exist at {where}; {missing}"
        if code in _REFUSED:
            return f"S3 refused to {action} {where} ({code}); check the credentials and the bucket's policy"
        message = exc.response.get("Error", {}).get("Message", "")
        return f"S3 failed to {action} {where}: {code} {message}".strip()
    if isinstance(exc, ParamValidationError):
        return f"bad S3 request to {action} {where}: {exc}"
    return (f"cannot reach {server} to {action} {where} ({type(exc).__name__}: {exc}); check --endpoint-url / "
            f"AWS_ENDPOINT_URL and that the server is up")
