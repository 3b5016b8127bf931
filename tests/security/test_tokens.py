"""protocol.auth without sockets: mint/verify round trips, expiry, tampering, rotation,
the prefix rule, and a property test that the parser raises only its typed errors."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.auth import (
    MAX_TOKEN_BYTES,
    BadClaims,
    BadSecret,
    BadToken,
    BadTtl,
    Claims,
    ExpiredToken,
    Forbidden,
    allows,
    authorize,
    authorize_admin,
    authorize_listing,
    issue,
    mint,
    parse_ttl,
    path_allowed,
    verify,
)
from protocol.errors import BadPath, ProtocolError

KEY = b"k" * 32
OLD_KEY = b"o" * 32
NOW = 1_700_000_000.0
SETTINGS = settings(max_examples=300, deadline=None, database=None)


def token_for(*prefixes: str, admin: bool = False, ttl_s: int = 3600, key: bytes = KEY) -> str:
    return issue(key, "tenant-a", prefixes, admin=admin, ttl_s=ttl_s, now=NOW)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_round_trip_keeps_every_claim() -> None:
    token = token_for("ds/", "eval", admin=True, ttl_s=60)
    assert token.startswith("hs1.") and token.count(".") == 2
    assert verify(token, [KEY], NOW + 59) == Claims(
        "tenant-a", ("ds/", "eval"), True, int(NOW), int(NOW) + 60
    )
    assert verify(token.encode(), [KEY], NOW) == verify(token, [KEY], NOW)


def test_expiry_is_exclusive() -> None:
    token = token_for("", ttl_s=60)
    verify(token, [KEY], NOW + 59.999)
    with pytest.raises(ExpiredToken):
        verify(token, [KEY], NOW + 60)


@pytest.mark.parametrize("position", ["payload", "signature"])
def test_any_changed_character_is_refused(position: str) -> None:
    token = token_for("ds/")
    version, payload, signature = token.split(".")
    for i in range(len(payload if position == "payload" else signature)):
        field = payload if position == "payload" else signature
        flipped = field[:i] + ("A" if field[i] != "A" else "B") + field[i + 1 :]
        forged = f"{version}.{flipped}.{signature}" if position == "payload" else \
            f"{version}.{payload}.{flipped}"
        with pytest.raises(BadToken):
            verify(forged, [KEY], NOW)


def test_widened_claims_without_the_key_are_refused() -> None:
    _, payload, signature = token_for("ds/").split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims.update(pfx=[""], adm=True)
    with pytest.raises(BadToken, match="signature"):
        verify(f"hs1.{b64(json.dumps(claims).encode())}.{signature}", [KEY], NOW)


def test_rotation_accepts_current_and_previous_secret_only() -> None:
    old = token_for("ds/", key=OLD_KEY)
    new = token_for("ds/", key=KEY)
    assert verify(old, [KEY, OLD_KEY], NOW).tenant == "tenant-a"
    assert verify(new, [KEY, OLD_KEY], NOW).tenant == "tenant-a"
    with pytest.raises(BadToken):
        verify(old, [KEY], NOW)  # rotation finished: the old secret is gone
    with pytest.raises(BadToken):
        verify(new, [], NOW)


@pytest.mark.parametrize(
    "claims",
    [
        Claims("", ("ds/",), False, 0, 1),
        Claims("has space", ("ds/",), False, 0, 1),
        Claims("a" * 65, ("ds/",), False, 0, 1),
        Claims("t", (), False, 0, 1),
    ],
)
def test_mint_refuses_claims_no_token_may_carry(claims: Claims) -> None:
    with pytest.raises(BadClaims):
        mint(KEY, claims)


@pytest.mark.parametrize("prefix", ["/abs", "a/../b", "a//b", "a\x00b", "%2e%2e/x"])
def test_mint_refuses_bad_prefixes(prefix: str) -> None:
    with pytest.raises(BadPath):
        token_for(prefix)


def test_short_secrets_and_bad_lifetimes_are_refused() -> None:
    with pytest.raises(BadSecret):
        issue(b"short", "t", [""], admin=False, ttl_s=60, now=NOW)
    with pytest.raises(BadTtl):
        issue(KEY, "t", [""], admin=False, ttl_s=0, now=NOW)


# (prefix, path, allowed): segments, never string prefixes.
PREFIX_CASES = [
    ("", "anything/at/all", True),
    ("ds/", "ds/x", True),
    ("ds", "ds/x", True),
    ("ds", "ds", True),
    ("ds/", "ds", True),
    ("ds", "dsX/secret", False),
    ("ds/", "dsX/secret", False),
    ("ds", "dsX", False),
    ("ds/a.bin", "ds/a.bin", True),
    ("ds/a.bin", "ds/a.bin2", False),
    ("ds/sub", "ds/other", False),
    ("ds/sub/", "ds/sub/deep/file", True),
    ("ds", "other/ds/x", False),
]


@pytest.mark.parametrize(("prefix", "path", "allowed"), PREFIX_CASES)
def test_prefix_rule(prefix: str, path: str, allowed: bool) -> None:
    assert path_allowed(prefix, path) is allowed
    claims = verify(token_for(prefix), [KEY], NOW)
    assert allows(claims, path) is allowed
    if not allowed:
        with pytest.raises(Forbidden) as caught:
            authorize(claims, path)
        assert caught.value.status_hint == 403


@pytest.mark.parametrize(
    ("prefixes", "listing", "allowed"),
    [
        ([""], "", True),
        (["ds/"], "ds/", True),
        (["ds/"], "ds", True),  # string prefix: dsX entries are filtered out of the answer
        (["ds/"], "ds/shard-0", True),
        (["ds/"], "", False),
        (["ds/"], "d", False),
        (["ds/a"], "ds/", False),
        (["ds/a", "other"], "other/x", True),
    ],
)
def test_listing_rule(prefixes: list[str], listing: str, allowed: bool) -> None:
    claims = verify(token_for(*prefixes), [KEY], NOW)
    if allowed:
        authorize_listing(claims, listing)
    else:
        with pytest.raises(Forbidden):
            authorize_listing(claims, listing)


def test_admin_scope() -> None:
    authorize_admin(verify(token_for("", admin=True), [KEY], NOW))
    with pytest.raises(Forbidden):
        authorize_admin(verify(token_for(""), [KEY], NOW))


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("15m", 900), ("1h", 3600), ("7d", 604800), ("90", 90)]
)
def test_ttl_suffixes(text: str, seconds: int) -> None:
    assert parse_ttl(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0h", "1w", "-1h", "1.5h", "h", "1 h x", "1e9"])
def test_bad_ttls(text: str) -> None:
    with pytest.raises(BadTtl):
        parse_ttl(text)


def test_errors_never_quote_the_token() -> None:
    token = token_for("ds/")
    _, payload, signature = token.split(".")
    bad = [
        token[:-2] + "xx", token + ".extra", token.replace("hs1", "hs2"), "hs1." + payload,
        f"hs1.{payload}.{signature}!", token + "é",
    ]
    for candidate in bad:
        with pytest.raises(BadToken) as caught:
            verify(candidate, [KEY], NOW)
        assert payload not in str(caught.value) and signature not in str(caught.value)
    with pytest.raises(ExpiredToken) as expired:
        verify(token, [KEY], NOW + 10**6)
    assert signature not in str(expired.value)


def test_oversized_tokens_are_refused_before_any_work() -> None:
    with pytest.raises(BadToken, match="longer"):
        verify("hs1." + "A" * MAX_TOKEN_BYTES + ".B", [KEY], NOW)


# -- property tests: arbitrary input raises only BadToken ------------------------

token_like = st.builds(
    lambda a, b, c: f"{a}.{b}.{c}",
    st.sampled_from(["hs1", "hs2", "", "HS1"]),
    st.text(alphabet="ABCDEFabcdef0123456789-_=+/.", max_size=80),
    st.text(alphabet="ABCDEFabcdef0123456789-_=+/", max_size=60),
)


@SETTINGS
@given(raw=st.text(max_size=300) | st.binary(max_size=300) | token_like)
def test_arbitrary_input_raises_only_bad_token(raw: str | bytes) -> None:
    with pytest.raises(BadToken):
        verify(raw, [KEY, OLD_KEY], NOW)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=4),
    max_leaves=12,
)
claim_dicts = st.fixed_dictionaries(
    {},
    optional={
        "ten": st.text(max_size=70) | json_values,
        "pfx": st.lists(st.text(max_size=20), max_size=3) | json_values,
        "adm": st.booleans() | json_values,
        "iat": st.integers() | json_values,
        "exp": st.integers() | json_values,
    },
)


def signed(payload: bytes) -> str:
    """A correctly signed token around arbitrary claim bytes: gets past the MAC check.

    Signed here from the documented format, so it also pins the format down.
    """
    field = b64(payload)
    mac = hmac.new(KEY, f"hs1.{field}".encode(), hashlib.sha256).digest()
    return f"hs1.{field}.{b64(mac)}"


def test_the_documented_format_verifies() -> None:
    claims = {"ten": "t", "pfx": ["ds/", ""], "adm": False, "iat": 0, "exp": int(NOW) + 1}
    assert verify(signed(json.dumps(claims).encode()), [KEY], NOW) == Claims(
        "t", ("ds/", ""), False, 0, int(NOW) + 1
    )
    for wrong in ({**claims, "exp": NOW + 1.0}, {**claims, "adm": 0}, {**claims, "pfx": "ds/"},
                  {**claims, "pfx": []}, {**claims, "ten": "a b"}, {**claims, "pfx": ["../x"]}):
        with pytest.raises(BadToken):
            verify(signed(json.dumps(wrong).encode()), [KEY], NOW)


@SETTINGS
@given(claims=claim_dicts | json_values, now=st.floats(allow_nan=False, allow_infinity=False))
def test_signed_arbitrary_claims_give_claims_or_bad_token(claims: object, now: float) -> None:
    try:
        result = verify(signed(json.dumps(claims).encode()), [KEY], now)
    except BadToken:
        return
    assert isinstance(result, Claims) and result.prefixes and now < result.expires_at


@SETTINGS
@given(payload=st.binary(max_size=200))
def test_signed_arbitrary_bytes_give_bad_token(payload: bytes) -> None:
    with contextlib.suppress(BadToken):  # valid JSON claims by chance are fine too
        verify(signed(payload), [KEY], NOW)


@SETTINGS
@given(prefix=st.text(max_size=30), path=st.text(max_size=30))
def test_prefix_checks_raise_only_typed_errors(prefix: str, path: str) -> None:
    try:
        claims = verify(token_for(prefix), [KEY], NOW)
    except ProtocolError:
        return
    with contextlib.suppress(Forbidden):  # allowed or forbidden, but nothing else
        authorize(claims, path)
        authorize_listing(claims, path)
