"""Error codes users write are kept as written, or refused where they are written (issue 25
item 5): ``StepNotCommitted("INSUFFICIENT_CREDIT")`` is stored as is, a code outside the rule
raises at construction, and exception names become readable codes."""

from __future__ import annotations

import pickle

import pytest

from celery_sagas import StepNotCommitted
from celery_sagas._delivery import snake_case
from celery_sagas.errors import SagaValidationError


@pytest.mark.parametrize("code", ["INSUFFICIENT_CREDIT", "card.declined", "Out-of-stock", "x"])
def test_a_code_users_write_is_kept_as_written(code: str) -> None:
    assert StepNotCommitted(code).code == code
    assert pickle.loads(pickle.dumps(StepNotCommitted(code))).code == code


@pytest.mark.parametrize("code", ["card declined", "", "9lives", "_x", "é", "a" * 65])
def test_a_code_outside_the_rule_raises_at_construction_naming_the_rule(code: str) -> None:
    with pytest.raises(SagaValidationError, match=r"\[A-Za-z\]\[A-Za-z0-9_.-\]\{0,63\}"):
        StepNotCommitted(code)


@pytest.mark.parametrize(
    ("name", "code"),
    [("HTTPError", "http_error"), ("CardDeclined", "card_declined"), ("IOError", "io_error"),
     ("SSLCertError", "ssl_cert_error"), ("OAuth2Error", "o_auth2_error"), ("Timeout", "timeout")],
)
def test_an_exception_name_becomes_a_readable_code(name: str, code: str) -> None:
    assert snake_case(name) == code
