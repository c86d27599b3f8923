"""Webhook rules without a service: SSRF address checks, signatures against the reference
`standardwebhooks` package, the backoff schedule, and the settings' validators."""

from __future__ import annotations

import base64
import ipaddress
import random
import time
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from jobs import webhooks
from jobs.config import Settings
from jobs.signing import generate_secret, signed_headers
from jobs.ssrf import UnsafeTarget, check_url

# SSRF -------------------------------------------------------------------


LOOPBACK_ONLY = [ipaddress.ip_network("127.0.0.1/32")]


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:9/x", "loopback"),
        ("http://[::1]/x", "loopback"),
        ("http://[::ffff:127.0.0.1]/x", "loopback"),  # IPv4-mapped IPv6 is the IPv4 address
        ("http://10.1.2.3/x", "private"),
        ("http://192.168.0.10/x", "private"),
        ("http://172.16.5.4/x", "private"),
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://[fd00:ec2::254]/", "metadata"),
        ("http://[fe80::1]/", "link-local"),
        ("http://0.0.0.0/", "unspecified"),
        ("http://100.64.0.1/", "not a public"),  # carrier-grade NAT
    ],
)
def test_private_targets_are_refused_without_the_allow_list(url: str, reason: str) -> None:
    with pytest.raises(UnsafeTarget, match=reason):
        check_url(url, allowed=[])


def test_allow_list_permits_exactly_what_it_lists() -> None:
    assert check_url("http://127.0.0.1:8080/hook", allowed=LOOPBACK_ONLY) == [ipaddress.ip_address("127.0.0.1")]
    with pytest.raises(UnsafeTarget, match="loopback"):
        check_url("http://127.0.0.2:8080/hook", allowed=LOOPBACK_ONLY)
    assert check_url("https://93.184.215.14/hook", allowed=[])  # a public address needs no allowance


def test_every_resolved_address_must_pass() -> None:
    # A name that resolves to one public and one private address (a rebinding trick) is refused.
    def resolver(host: str, port: int) -> list:
        return [ipaddress.ip_address("93.184.215.14"), ipaddress.ip_address("10.0.0.7")]

    with pytest.raises(UnsafeTarget, match=r"hooks\.example\.com resolves to 10\.0\.0\.7"):
        check_url("https://hooks.example.com/x", allowed=[], resolver=resolver)
    with pytest.raises(UnsafeTarget, match="http and https"):
        check_url("ftp://hooks.example.com/x", allowed=[])


# Signing, schedule, settings -------------------------------------------------------


def test_signature_matches_the_reference_implementation() -> None:
    secret = generate_secret()
    assert len(base64.b64decode(secret.removeprefix("whsec_"))) >= 24
    body = b'{"type":"job.succeeded","data":{"job_id":"x"}}'
    timestamp = int(time.time())
    headers = signed_headers(secrets=[secret], webhook_id="msg_1", timestamp=timestamp, body=body)
    reference = Webhook(secret)
    assert headers["webhook-signature"] == reference.sign(
        "msg_1", datetime.fromtimestamp(timestamp, UTC), body.decode()
    )
    assert reference.verify(body, headers)["data"]["job_id"] == "x"
    with pytest.raises(WebhookVerificationError):
        reference.verify(body.replace(b"x", b"y"), headers)


def test_backoff_schedule_jitter_and_retry_after() -> None:
    config = Settings(webhook_retry_schedule=[0, 5, 300], webhook_jitter=0.1, webhook_retry_after_max=600)
    rng = random.Random(0)
    for _ in range(100):  # jitter stays within ±10 % of the planned gap
        assert 4.5 <= webhooks.next_delay(attempts=1, settings=config, rng=rng) <= 5.5
        assert 270 <= webhooks.next_delay(attempts=2, settings=config, rng=rng) <= 330
    assert webhooks.next_delay(attempts=3, settings=config) is None  # schedule spent: give up
    assert webhooks.next_delay(attempts=1, settings=config, retry_after=120) == 120
    assert webhooks.next_delay(attempts=1, settings=config, retry_after=10**6) == 600  # capped
    schedule = Settings().webhook_retry_schedule
    assert schedule[:7] == [0, 5, 300, 1800, 7200, 18000, 36000]
    assert 20 * 3600 <= sum(schedule) <= 36 * 3600  # "about a day"


def test_settings_refuse_bad_webhook_values() -> None:
    with pytest.raises(ValidationError, match="not an IP network"):
        Settings(webhook_allowed_networks=["localhost"])
    with pytest.raises(ValidationError, match="at least one attempt"):
        Settings(webhook_retry_schedule=[])
    with pytest.raises(ValidationError, match="webhook_timeout"):
        Settings(webhook_timeout=120)
    servers = {"database_url": "postgresql+psycopg://db/quant", "broker_url": "redis://redis:6379/0"}
    with pytest.raises(ValidationError, match="metadata"):
        Settings(environment="production", webhook_allowed_networks=["169.254.0.0/16"], **servers)
    assert Settings(environment="production", webhook_allowed_networks=["10.1.0.0/16"], **servers)
