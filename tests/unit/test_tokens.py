"""Resume tokens for human approvals: mint, verify, rotate, refuse everything else."""

from __future__ import annotations

import base64
import hashlib
import hmac
import inspect
import json
import pickle
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_sagas._approvals.tokens import Claims, TokenSigner, token_hash
from celery_sagas.errors import ApprovalTokenExpired, ApprovalTokenInvalid, SagaValidationError

OLD = b"o" * 16 + bytes(range(16))
NEW = "n" * 40
OTHER = b"x" * 32
NONCE = "AbCdEfGhIjKlMnOpQrStUvWx"
EXP = 1_700_000_900_000
NOW = 1_700_000_000_000
SIGNER = TokenSigner([NEW, OLD])


def mint(signer: TokenSigner = SIGNER, /, **claims: Any) -> str:
    fields: dict[str, Any] = {"approval_id": "apr-1", "nonce": NONCE, "expires_at_ms": EXP}
    return signer.mint(**{**fields, **claims})


# An independent writer of the documented wire format, to sign claim sets mint() would refuse.
def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def sign_segment(segment: str, secret: bytes = NEW.encode()) -> str:
    key = hmac.new(secret, b"celery_sagas.approvals.tokens/v1", hashlib.sha256).digest()
    signed = f"v1.{segment}"
    return f"{signed}.{b64(hmac.new(key, signed.encode(), hashlib.sha256).digest())}"


def sign_raw(claims_json: bytes, secret: bytes = NEW.encode()) -> str:
    return sign_segment(b64(claims_json), secret)


def sign(claims: dict[str, Any]) -> str:
    return sign_raw(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode())


GOOD_CLAIMS = {"aid": "apr-1", "exp": EXP, "n": NONCE, "v": 1}


def segments(token: str) -> list[str]:
    return token.split(".")


# --- round trip and format -------------------------------------------------------------------


def test_minted_token_verifies_to_its_claims() -> None:
    claims = SIGNER.verify(mint(), now_ms=NOW)
    assert claims == Claims(version=1, approval_id="apr-1", nonce=NONCE, expires_at_ms=EXP)


def test_token_follows_the_documented_wire_format() -> None:
    token = mint()
    assert token == sign(GOOD_CLAIMS)
    version, claims, signature = segments(token)
    assert (version, len(signature)) == ("v1", 43)
    assert "=" not in token
    assert json.loads(base64.urlsafe_b64decode(claims + "==")) == GOOD_CLAIMS


def test_minting_is_deterministic_and_claims_bound() -> None:
    assert mint() == mint()
    assert mint(nonce=NONCE[::-1]) != mint()


def test_longest_claims_still_fit_the_size_limit() -> None:
    token = mint(approval_id="a" * 128, nonce="n" * 64, expires_at_ms=2**53 - 1)
    assert len(token) <= 2048
    assert SIGNER.verify(token, now_ms=NOW).approval_id == "a" * 128


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("approval_id", ""),
        ("approval_id", "has space"),
        ("approval_id", "a" * 129),
        ("approval_id", 7),
        ("nonce", "short"),
        ("nonce", "n" * 65),
        ("nonce", "not/url+safe=====base64"),
        ("nonce", None),
        ("expires_at_ms", -1),
        ("expires_at_ms", 2**53),
        ("expires_at_ms", 1.5),
        ("expires_at_ms", True),
    ],
)
def test_mint_refuses_invalid_claims(field: str, value: object) -> None:
    with pytest.raises(SagaValidationError):
        mint(**{field: value})


def test_token_hash_is_sha256_hex_of_the_token() -> None:
    token = mint()
    assert token_hash(token) == hashlib.sha256(token.encode()).hexdigest()
    assert token_hash(token) != token_hash(mint(nonce=NONCE[::-1]))


def test_token_hash_refuses_non_text() -> None:
    with pytest.raises(SagaValidationError):
        token_hash(b"v1.x.y")  # type: ignore[arg-type]


def test_verify_refuses_an_invalid_clock_reading() -> None:
    with pytest.raises(SagaValidationError):
        SIGNER.verify(mint(), now_ms=-1)


# --- expiry ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("now", "expired"), [(EXP - 1, False), (EXP, True), (EXP + 1, True)])
def test_token_expires_at_exactly_its_expiry(now: int, expired: bool) -> None:
    if expired:
        with pytest.raises(ApprovalTokenExpired) as caught:
            SIGNER.verify(mint(), now_ms=now)
        assert caught.value.approval_id == "apr-1"  # type: ignore[attr-defined]
        assert caught.value.expires_at_ms == EXP  # type: ignore[attr-defined]
    else:
        assert SIGNER.verify(mint(), now_ms=now).expires_at_ms == EXP


def test_forged_expired_token_is_invalid_not_expired() -> None:
    forged = sign_raw(json.dumps({"aid": "a", "exp": 1, "n": NONCE, "v": 1}).encode(), OTHER)
    with pytest.raises(ApprovalTokenInvalid):
        SIGNER.verify(forged, now_ms=NOW)


# --- signatures and key rotation -------------------------------------------------------------


def flip_last(text: str) -> str:
    return text[:-1] + ("A" if text[-1] != "A" else "B")


def test_forged_signatures_are_refused() -> None:
    version, claims, signature = segments(mint())
    other_signature = segments(mint(approval_id="apr-2"))[2]
    forgeries = [
        f"{version}.{claims}.{'A' * 43}",
        f"{version}.{claims}.{flip_last(signature)}",
        f"{version}.{claims}.{signature[::-1]}",
        f"{version}.{claims}.{other_signature}",
    ]
    for forged in forgeries:
        with pytest.raises(ApprovalTokenInvalid):
            SIGNER.verify(forged, now_ms=NOW)


def test_non_canonical_signature_with_the_same_bytes_is_refused() -> None:
    token = mint()
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    # 43 base64 characters carry 258 bits; the last character's two low bits are padding.
    last = alphabet.index(token[-1])
    for low in range(1, 4):
        twin = token[:-1] + alphabet[last ^ low]
        assert base64.urlsafe_b64decode(twin.split(".")[2] + "=") == base64.urlsafe_b64decode(
            token.split(".")[2] + "="
        )
        with pytest.raises(ApprovalTokenInvalid):
            SIGNER.verify(twin, now_ms=NOW)


@pytest.mark.parametrize(
    ("claim", "value"),
    [("aid", "apr-2"), ("exp", EXP + 1), ("n", NONCE[::-1]), ("v", 2)],
)
def test_tampered_claims_are_refused(claim: str, value: object) -> None:
    signature = segments(mint())[2]
    tampered = {**GOOD_CLAIMS, claim: value}
    segment = b64(json.dumps(tampered, separators=(",", ":"), sort_keys=True).encode())
    with pytest.raises(ApprovalTokenInvalid):
        SIGNER.verify(f"v1.{segment}.{signature}", now_ms=NOW)


def test_token_from_another_secret_is_refused() -> None:
    with pytest.raises(ApprovalTokenInvalid):
        SIGNER.verify(mint(TokenSigner([OTHER])), now_ms=NOW)


def test_rotation_newest_secret_signs_and_every_secret_verifies() -> None:
    from_old = mint(TokenSigner([OLD]))
    from_rotated = mint(TokenSigner([NEW, OLD]))
    assert TokenSigner([NEW, OLD]).verify(from_old, now_ms=NOW).approval_id == "apr-1"
    assert TokenSigner([NEW]).verify(from_rotated, now_ms=NOW).approval_id == "apr-1"
    with pytest.raises(ApprovalTokenInvalid):
        TokenSigner([OLD]).verify(from_rotated, now_ms=NOW)


def test_token_signed_with_a_removed_secret_is_refused() -> None:
    before_rotation = mint(TokenSigner([OLD]))
    with pytest.raises(ApprovalTokenInvalid):
        TokenSigner([NEW]).verify(before_rotation, now_ms=NOW)


# --- malformed input -------------------------------------------------------------------------


def test_truncated_tokens_are_refused() -> None:
    token = mint()
    for end in range(len(token)):
        with pytest.raises(ApprovalTokenInvalid):
            SIGNER.verify(token[:end], now_ms=NOW)


def signed_with_claims_of(size: int) -> str:
    """A correctly signed token whose claims JSON is exactly ``size`` bytes (padded)."""
    claims = json.dumps({**GOOD_CLAIMS, "pad": ""}, separators=(",", ":"), sort_keys=True)
    return sign_raw(claims.replace('"pad":""', '"pad":"' + "p" * (size - len(claims)) + '"').encode())


def test_oversized_token_is_refused_before_parsing() -> None:
    oversized = signed_with_claims_of(1501)
    assert len(oversized) == 2049
    with pytest.raises(ApprovalTokenInvalid, match="longer than 2048"):
        SIGNER.verify(oversized, now_ms=NOW)
    with pytest.raises(ApprovalTokenInvalid, match="longer than 2048"):
        SIGNER.verify("\u20ac" * 10_000_000, now_ms=NOW)


def test_longest_possible_token_reaches_the_claims_check() -> None:
    longest = signed_with_claims_of(1500)  # 2048 itself is no valid base64 length
    assert len(longest) == 2047
    with pytest.raises(ApprovalTokenInvalid, match="malformed claims"):
        SIGNER.verify(longest, now_ms=NOW)


@pytest.mark.parametrize(
    "garbage",
    [
        None,
        b"v1.e30.AAAA",
        bytearray(b"v1"),
        17,
        ["v1", "x", "y"],
        object(),
        "",
        ".",
        "..",
        "v1..",
        "v2." + "e30." + "A" * 43,
        "V1.e30." + "A" * 43,
        "v1.e30." + "A" * 42,
        "v1.e30." + "A" * 44,
        "v1.e30=." + "A" * 43,
        "v1.e3+0." + "A" * 43,
        " v1.e30." + "A" * 43,
        "v1.e30." + "A" * 43 + "\n",
        "v1.e30.e30." + "A" * 43,
        "v1.\u00e9\u00e9." + "A" * 43,
        "v1.\ud800." + "A" * 43,
        "\x00" * 100,
    ],
)
def test_garbage_is_invalid(garbage: object) -> None:
    with pytest.raises(ApprovalTokenInvalid):
        SIGNER.verify(garbage, now_ms=NOW)


class Sneaky(str):
    """A str subclass that lies about itself."""

    def __len__(self) -> int:
        return 1

    def rpartition(self, sep: str) -> tuple[str, str, str]:
        raise RuntimeError("boom")


def test_str_subclass_is_read_as_plain_text() -> None:
    assert SIGNER.verify(Sneaky(mint()), now_ms=NOW).approval_id == "apr-1"
    with pytest.raises(ApprovalTokenInvalid, match="longer than 2048"):
        SIGNER.verify(Sneaky("A" * 3000), now_ms=NOW)


class Impostor(str):
    """A str subclass whose bytes claim to be another token's."""

    def encode(self, *args: Any, **kwargs: Any) -> bytes:
        return b"v1.another.token"


def test_token_hash_hashes_the_text_that_verify_read() -> None:
    token = mint()
    assert token_hash(Impostor(token)) == token_hash(token)


# Correctly signed, so only the strict claims parser stands between them and acceptance.
@pytest.mark.parametrize(
    "claims_json",
    [
        b"",
        b"not json",
        b"\xff\xfe\x00",
        b"[]",
        b"null",
        b"{}",
        b'{"aid":"apr-1","exp":1700000900000,"n":"AbCdEfGhIjKlMnOpQrStUvWx"}',
        b'{"aid":"apr-1","exp":1700000900000,"n":"AbCdEfGhIjKlMnOpQrStUvWx","v":1,"x":0}',
        b'{"aid":"apr-1","exp":1700000900000,"n":"AbCdEfGhIjKlMnOpQrStUvWx","v":true}',
        b'{"aid":"apr-1","exp":1700000900000,"n":"AbCdEfGhIjKlMnOpQrStUvWx","v":1.0}',
        b'{"aid":"apr-1","exp":1700000900000,"n":"AbCdEfGhIjKlMnOpQrStUvWx","v":"1"}',
        b'{"aid":"apr-1","exp":1700000900000,"n":"AbCdEfGhIjKlMnOpQrStUvWx","v":2}',
        b'{"aid":"apr-1","exp":"1700000900000","n":"AbCdEfGhIjKlMnOpQrStUvWx","v":1}',
        b'{"aid":"apr-1","exp":1700000900000.0,"n":"AbCdEfGhIjKlMnOpQrStUvWx","v":1}',
        b'{"aid":"apr-1","exp":-5,"n":"AbCdEfGhIjKlMnOpQrStUvWx","v":1}',
        b'{"aid":"apr-1","exp":9007199254740992,"n":"AbCdEfGhIjKlMnOpQrStUvWx","v":1}',
        b'{"aid":"apr-1","exp":NaN,"n":"AbCdEfGhIjKlMnOpQrStUvWx","v":1}',
        b'{"aid":"apr 1","exp":1700000900000,"n":"AbCdEfGhIjKlMnOpQrStUvWx","v":1}',
        b'{"aid":"","exp":1700000900000,"n":"AbCdEfGhIjKlMnOpQrStUvWx","v":1}',
        b'{"aid":7,"exp":1700000900000,"n":"AbCdEfGhIjKlMnOpQrStUvWx","v":1}',
        b'{"aid":"apr-1","exp":1700000900000,"n":"short","v":1}',
        b'{"aid":"apr-1","exp":1700000900000,"n":null,"v":1}',
        b'{"aid":"apr-1","exp":1700000900000,"n":"AbCdEfGhIjKlMnOpQrStUvWx","v":1,"v":1}',
        b'{"v":1,"n":"AbCdEfGhIjKlMnOpQrStUvWx","exp":1700000900000,"aid":"apr-1"}',
        b'{"aid": "apr-1", "exp": 1700000900000, "n": "AbCdEfGhIjKlMnOpQrStUvWx", "v": 1}',
        b'{"aid":"apr-\\u0031","exp":1700000900000,"n":"AbCdEfGhIjKlMnOpQrStUvWx","v":1}',
        b"[" * 750 + b"]" * 750,
        b'{"aid":"apr-1","exp":1' + b"0" * 1400 + b',"n":"AbCdEfGhIjKlMnOpQrStUvWx","v":1}',
    ],
)
def test_signed_but_malformed_claims_are_invalid(claims_json: bytes) -> None:
    token = sign_raw(claims_json)
    assert len(token) <= 2048
    with pytest.raises(ApprovalTokenInvalid):
        SIGNER.verify(token, now_ms=NOW)


def test_deeply_nested_signed_claims_hitting_the_recursion_limit_are_invalid() -> None:
    token = sign_raw(b"[" * 750 + b"]" * 750)
    limit = sys.getrecursionlimit()
    depth = len(inspect.stack(0))
    sys.setrecursionlimit(depth + 100)  # the JSON decoder now runs out of stack
    try:
        with pytest.raises(ApprovalTokenInvalid, match="malformed claims"):
            SIGNER.verify(token, now_ms=NOW)
    finally:
        sys.setrecursionlimit(limit)


def test_signed_claims_with_non_canonical_base64_are_invalid() -> None:
    segment = segments(mint(approval_id="apr-12"))[1]  # 73 bytes: the last character has slack
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    twin = segment[:-1] + alphabet[alphabet.index(segment[-1]) ^ 1]
    assert base64.urlsafe_b64decode(twin + "==") == base64.urlsafe_b64decode(segment + "==")
    with pytest.raises(ApprovalTokenInvalid, match="not canonically encoded"):
        SIGNER.verify(sign_segment(twin), now_ms=NOW)


def test_invalid_token_errors_never_quote_the_token() -> None:
    token = mint()
    for bad in (token[:-1] + "A", token[:40], sign_raw(b"x" * 60)):
        with pytest.raises(ApprovalTokenInvalid) as caught:
            SIGNER.verify(bad, now_ms=NOW)
        shown = f"{caught.value} {caught.value!r}"
        assert bad not in shown and segments(token)[1] not in shown
        assert caught.value.__cause__ is None and caught.value.__suppress_context__


# --- secrets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "secrets",
    [
        [],
        (),
        [b"s" * 31],
        ["s" * 31],
        [b"s" * 32, b"s" * 31],
        ["\u00e9" * 15],  # 30 bytes in UTF-8
        [None],
        [bytearray(b"s" * 32)],
        ["\ud800" * 40],
        "s" * 64,
        b"s" * 64,
        None,
        {b"s" * 32},
    ],
)
def test_unusable_secrets_are_refused(secrets: Any) -> None:
    with pytest.raises(SagaValidationError) as caught:
        TokenSigner(secrets)
    assert "s" * 31 not in f"{caught.value} {caught.value!r}"


@pytest.mark.parametrize("secret", [b"s" * 32, "s" * 32, "\u00e9" * 16])
def test_secrets_of_32_bytes_are_accepted(secret: bytes | str) -> None:
    signer = TokenSigner([secret])
    assert signer.verify(mint(signer), now_ms=NOW).approval_id == "apr-1"


def test_signer_and_claims_never_show_secrets_or_token_material() -> None:
    token = mint()
    claims = SIGNER.verify(token, now_ms=NOW)
    shown = f"{SIGNER!r} {SIGNER} {claims!r} {claims}"
    for secret in (NEW, OLD.decode("latin-1"), OLD.hex(), token, NONCE, *segments(token)[1:]):
        assert secret not in shown
    assert not hasattr(SIGNER, "__dict__")


def test_signer_refuses_to_be_pickled() -> None:
    with pytest.raises(TypeError):
        pickle.dumps(SIGNER)


def test_claims_are_frozen() -> None:
    claims = SIGNER.verify(mint(), now_ms=NOW)
    with pytest.raises(AttributeError):
        claims.approval_id = "other"  # type: ignore[misc]


# --- fuzz ------------------------------------------------------------------------------------

TOKEN = mint()
EXPIRED = mint(expires_at_ms=NOW)
URLSAFE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."

anything = st.one_of(
    st.text(),
    st.text(alphabet=URLSAFE),
    st.from_regex(r"v1\.[A-Za-z0-9_-]{0,400}\.[A-Za-z0-9_-]{43}", fullmatch=True),
    st.binary(),
    st.none(),
    st.integers(),
    st.floats(),
    st.lists(st.text(), max_size=3),
    st.dictionaries(st.text(), st.integers(), max_size=3),
)


@settings(max_examples=400, deadline=None)
@given(anything)
def test_fuzz_arbitrary_input_is_only_ever_invalid(value: object) -> None:
    with pytest.raises(ApprovalTokenInvalid):
        SIGNER.verify(value, now_ms=NOW)


@st.composite
def mutations(draw: st.DrawFn, token: str) -> str:
    position = draw(st.integers(0, len(token)))
    chars = st.text(alphabet=st.sampled_from(URLSAFE) | st.characters(), max_size=4)
    kind = draw(st.sampled_from(["replace", "insert", "delete", "swap", "case"]))
    if kind == "replace":
        return token[:position] + draw(chars) + token[position + 1 :]
    if kind == "insert":
        return token[:position] + draw(chars) + token[position:]
    if kind == "delete":
        return token[:position] + token[position + draw(st.integers(1, 8)) :]
    if kind == "swap":
        other = draw(st.integers(0, len(token) - 1))
        swapped = list(token)
        if position < len(token):
            swapped[position], swapped[other] = swapped[other], swapped[position]
        return "".join(swapped)
    return token[:position] + token[position:].swapcase()


@settings(max_examples=600, deadline=None)
@given(mutations(TOKEN))
def test_fuzz_mutated_token_never_verifies_unless_identical(mutated: str) -> None:
    if mutated == TOKEN:
        assert SIGNER.verify(mutated, now_ms=NOW).approval_id == "apr-1"
    else:
        with pytest.raises(ApprovalTokenInvalid):
            SIGNER.verify(mutated, now_ms=NOW)


@settings(max_examples=300, deadline=None)
@given(mutations(EXPIRED))
def test_fuzz_mutated_expired_token_is_invalid_unless_identical(mutated: str) -> None:
    expected = ApprovalTokenExpired if mutated == EXPIRED else ApprovalTokenInvalid
    with pytest.raises(expected):
        SIGNER.verify(mutated, now_ms=NOW)


@settings(max_examples=200, deadline=None)
@given(
    approval_id=st.from_regex(r"[\x21-\x7a\x7c\x7e]{1,128}", fullmatch=True),
    nonce=st.from_regex(r"[A-Za-z0-9_-]{16,64}", fullmatch=True),
    expires_at_ms=st.integers(NOW + 1, 2**53 - 1),
)
def test_fuzz_every_valid_claim_set_round_trips(approval_id: str, nonce: str, expires_at_ms: int) -> None:
    token = SIGNER.mint(approval_id=approval_id, nonce=nonce, expires_at_ms=expires_at_ms)
    assert SIGNER.verify(token, now_ms=NOW) == Claims(1, approval_id, nonce, expires_at_ms)
