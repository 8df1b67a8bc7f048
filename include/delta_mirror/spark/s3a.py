"""S3 table locations for Delta-Spark: the table's storage options as Hadoop s3a settings.

The settings go on the running session's Hadoop configuration, scoped to the table's bucket
(``fs.s3a.bucket.<bucket>.*``), so one shared session reads tables in several buckets with
different endpoints or keys, and nothing has to be known when the session starts. The s3a
connector is ``org.apache.hadoop:hadoop-aws`` (``EXTRA_PACKAGES`` in ``spark/session.py``). Like the
session, it sits at the bottom tier although it lives in ``spark/`` (``jobs/`` and ``spark/`` both
use it).

Secrets (the secret key, a session token) are only ever handed to the JVM; ``redact`` removes
them from any text that may reach a log or an error message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from delta_mirror.errors import PermanentError

# object_store / deltalake option names (upper case, with or without the AWS_ prefix) -> ours
_ALIASES = {
    "ENDPOINT_URL": "endpoint",
    "ENDPOINT": "endpoint",
    "ACCESS_KEY_ID": "access_key",
    "SECRET_ACCESS_KEY": "secret_key",
    "SESSION_TOKEN": "token",
    "TOKEN": "token",
    "REGION": "region",
    "DEFAULT_REGION": "region",
    "ALLOW_HTTP": "allow_http",
    "VIRTUAL_HOSTED_STYLE_REQUEST": "virtual_hosted",
}
_SECRET_FIELDS = ("secret_key", "token")
_TRUE = ("1", "true", "yes")


def _options(options: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in options.items():
        name = key.upper().removeprefix("AWS_")
        field = _ALIASES.get(name)
        if field is not None and value and field not in out:
            out[field] = str(value)
    return out


def s3a_uri(location: str) -> str:
    """``s3://bucket/prefix`` (or ``s3a://``) as the ``s3a://`` URI Hadoop reads."""
    parsed = urlparse(location)
    if parsed.scheme not in ("s3", "s3a") or not parsed.netloc:
        raise PermanentError(
            f"not an S3 location: {location}", hint="use s3://bucket/prefix for tables on S3"
        )
    return f"s3a://{parsed.netloc}{parsed.path}".rstrip("/")


def s3a_settings(bucket: str, options: Mapping[str, str]) -> dict[str, str]:
    """Hadoop settings (``fs.s3a.bucket.<bucket>.*``) for the bucket from AWS-style options.

    A custom endpoint (MinIO, moto, any S3-compatible server) gets path-style requests unless
    ``AWS_VIRTUAL_HOSTED_STYLE_REQUEST`` is true; ``AWS_ALLOW_HTTP`` (or an ``http://`` endpoint)
    turns TLS off; keys select the static (or, with a session token, temporary) credential provider,
    no keys leave AWS's default chain (instance profile, environment, ...).
    """
    opts = _options(options)
    settings: dict[str, str] = {}
    endpoint = opts.get("endpoint")
    if endpoint:
        settings["endpoint"] = endpoint
        virtual = opts.get("virtual_hosted", "").lower() in _TRUE
        settings["path.style.access"] = "false" if virtual else "true"
    if opts.get("allow_http", "").lower() in _TRUE or (endpoint or "").startswith("http://"):
        settings["connection.ssl.enabled"] = "false"
    if opts.get("region"):
        settings["endpoint.region"] = opts["region"]
    if opts.get("access_key") and opts.get("secret_key"):
        settings["access.key"] = opts["access_key"]
        settings["secret.key"] = opts["secret_key"]
        if opts.get("token"):
            settings["session.token"] = opts["token"]
            settings["aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        else:
            settings["aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    return {f"fs.s3a.bucket.{bucket}.{key}": value for key, value in settings.items()}


def configure_s3a(spark: Any, location: str, options: Mapping[str, str]) -> str:
    """Set the bucket's s3a settings on ``spark``'s Hadoop configuration; return the s3a:// URI.

    Hadoop caches one file system per bucket: settings changed for a bucket already opened in this
    session take effect only in a new session.
    """
    uri = s3a_uri(location)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3a_settings(urlparse(uri).netloc, options).items():
        conf.set(key, value)
    return uri


def redact(text: str, options: Mapping[str, str]) -> str:
    """``text`` with the options' secret key and session token replaced by ``***``."""
    opts = _options(options)
    for field in _SECRET_FIELDS:
        secret = opts.get(field)
        if secret:
            text = text.replace(secret, "***")
    return text


__all__ = ["configure_s3a", "redact", "s3a_settings", "s3a_uri"]
