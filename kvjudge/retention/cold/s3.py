"""An S3-compatible bucket as cold store (:class:`S3ColdStore`, through boto3): checksums the server checks and
keeps, manifests written only where none is."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from typing import Any

from kvjudge.errors import ColdStoreError, UsageError
from kvjudge.retention.cold.interface import (BlobBody, ManifestWrite, ObjectInfo, body_chunks, checked,
                                              compare_manifest, not_the_ref)
from kvjudge.retention.cold.keys import blob_key, ref_hex
from kvjudge.retention.s3client import failure_line, http_status, make_s3_client, s3_errors


class S3ColdStore:
    """An S3-compatible bucket (AWS, SeaweedFS, MinIO, …) as cold store, through boto3.

    Blobs are uploaded with their SHA-256 as the S3 checksum (``ChecksumSHA256``), so the server refuses a
    body that does not hash to its ref and keeps the checksum for a cheap read-back check (HEAD). Manifests
    are written with ``If-None-Match: *``; if one exists it is read back and compared. Credentials, region
    and (when ``endpoint_url`` is None) the endpoint come from boto3's usual sources: ``AWS_*`` environment
    variables, ``~/.aws``, instance roles; ``endpoint_url`` is then the endpoint boto3 resolved.
    """

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 client: Any = None) -> None:
        if not bucket:
            raise UsageError("an s3:// target needs a bucket: s3://BUCKET[/PREFIX]")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client = client if client is not None else make_s3_client(endpoint_url)
        # The endpoint really used (boto3's resolution when none was given): the one a move records.
        self.endpoint_url: str | None = endpoint_url or self._client.meta.endpoint_url

    def __repr__(self) -> str:
        return f"S3ColdStore({self.url!r}, endpoint_url={self.endpoint_url!r})"

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _where(self) -> str:
        return f"{self.url} at {self.endpoint_url}"

    def _fail(self, exc: Exception, action: str) -> ColdStoreError:
        """One actionable line for any boto3/botocore failure."""
        return ColdStoreError(failure_line(exc, action=action, where=self._where(), bucket=self.bucket,
                                           missing="create it first", server="the cold store"))

    @staticmethod
    def _errors() -> tuple[type[Exception], ...]:
        return s3_errors()

    @staticmethod
    def _status(exc: Exception) -> int | None:
        return http_status(exc)

    def check(self) -> None:
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except self._errors() as exc:
            if self._status(exc) == 404:
                raise ColdStoreError(f"bucket {self.bucket!r} does not exist at {self._where()}; create it first") from exc
            raise self._fail(exc, "reach") from exc

    def put_blob(self, ref: str, body: BlobBody) -> None:
        data = b"".join(body_chunks(body))
        digest = hashlib.sha256(data).digest()
        if digest.hex() != ref_hex(ref):
            raise not_the_ref(ref, self.url)
        # The server checks it too: a body that does not hash to its checksum is refused.
        checksum = base64.b64encode(digest).decode()
        try:
            response = self._client.put_object(
                Bucket=self.bucket, Key=self._key(blob_key(ref)), Body=data, ChecksumSHA256=checksum
            )
        except self._errors() as exc:
            raise self._fail(exc, f"upload {ref} to") from exc
        echoed = response.get("ChecksumSHA256")
        if echoed is not None and echoed != checksum:
            raise ColdStoreError(f"{self._where()} acknowledged {ref} with checksum {echoed}; refusing to trust it")

    def put_pack(self, key: str, bodies: Iterable[tuple[str, BlobBody]]) -> None:
        chunks: list[bytes] = []
        pack = hashlib.sha256()
        for ref, body in bodies:
            digest = hashlib.sha256()
            for chunk in body_chunks(body):
                digest.update(chunk)
                pack.update(chunk)
                chunks.append(chunk)
            if digest.hexdigest() != ref_hex(ref):
                raise not_the_ref(ref, self.url)
        # The whole pack's SHA-256 as its checksum: the server refuses bytes that are not the ones hashed here.
        checksum = base64.b64encode(pack.digest()).decode()
        try:
            response = self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=b"".join(chunks),
                                               ChecksumSHA256=checksum)
        except self._errors() as exc:
            raise self._fail(exc, f"upload {key} to") from exc
        echoed = response.get("ChecksumSHA256")
        if echoed is not None and echoed != checksum:
            raise ColdStoreError(f"{self._where()} acknowledged {key} with checksum {echoed}; refusing to trust it")

    def stat_blob(self, ref: str) -> ObjectInfo | None:
        return self.stat_object(blob_key(ref))

    def stat_object(self, key: str) -> ObjectInfo | None:
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self._key(key), ChecksumMode="ENABLED")
        except self._errors() as exc:
            if self._status(exc) == 404:
                return None
            raise self._fail(exc, f"stat {key} in") from exc
        checksum = head.get("ChecksumSHA256")
        digest = base64.b64decode(checksum).hex() if checksum and "-" not in checksum else None
        return ObjectInfo(key=key, size=int(head["ContentLength"]), sha256=digest)

    def _get(self, key: str, what: str) -> bytes | None:
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            return response["Body"].read()
        except self._errors() as exc:
            if self._status(exc) == 404:
                return None
            raise self._fail(exc, f"read {what} from") from exc

    def get_blob(self, ref: str) -> bytes | None:
        body = self._get(blob_key(ref), ref)
        return None if body is None else checked(ref, body, f"{self.url}/{blob_key(ref)}")

    def get_range(self, ref: str, key: str, offset: int, size: int) -> bytes | None:
        where = f"{self.url}/{key} at offset {offset}"
        if size == 0:  # no byte range names nothing: the object need only exist
            return None if self.stat_object(key) is None else checked(ref, b"", where)
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self._key(key),
                                               Range=f"bytes={offset}-{offset + size - 1}")
            body = response["Body"].read()
        except self._errors() as exc:
            if self._status(exc) == 404:
                return None
            if self._status(exc) == 416:  # the object ends before the range starts: it was cut
                return checked(ref, b"", where)
            raise self._fail(exc, f"read {ref} from") from exc
        return checked(ref, body, where)

    def flush(self) -> None:
        pass  # every acknowledged PUT is durable already

    def put_manifest(self, key: str, data: bytes) -> ManifestWrite:
        checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
        try:
            self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data,
                                    ChecksumSHA256=checksum, IfNoneMatch="*",
                                    ContentType="application/json")
            created = True
        except self._errors() as exc:
            # 412: it exists. 409: a concurrent conditional write is in flight (S3 ConditionalRequestConflict).
            if self._status(exc) not in (412, 409):
                raise self._fail(exc, f"write manifest {key} to") from exc
            created = False
        if not created:
            compare_manifest(key, data, self._get(key, "manifest"), f"{self.url}/{key}")
        return ManifestWrite(key=key, created=created)

    def get_manifest(self, key: str) -> bytes | None:
        return self._get(key, "manifest")

    def discard_partial(self, keys: Iterable[str]) -> int:
        return 0  # a PUT applies whole or not at all: nothing partial to discard

