"""A keyword neither the saga decorators nor Celery's ``Task`` know is refused at decoration,
naming the closest known option (issue 25 item 12): ``idempotnet=True`` was ignored."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from celery import Celery

from celery_sagas import Sagas
from celery_sagas._definitions import COMPENSATOR_OPTIONS, STEP_OPTIONS
from celery_sagas.errors import SagaConfigurationError


@pytest.fixture
def sagas() -> Sagas:
    return Sagas(Celery("options", broker="memory://localhost/"), store="memory://",
                 allow_non_durable=True)


@pytest.mark.parametrize(
    ("given", "meant"),
    [("idempotnet", "idempotent"), ("compensat", "compensate"), ("capabilty", "capability"),
     ("queu", "queue"), ("soft_time_limt", "soft_time_limit")],
)
def test_a_misspelt_step_option_is_refused_naming_the_closest_one(
    sagas: Sagas, given: str, meant: str
) -> None:
    with pytest.raises(SagaConfigurationError, match=f"unknown option {given}=: did you mean {meant}="):
        sagas.step(compensate=None, **{given: True})(lambda: None)


def test_a_misspelt_compensator_option_is_refused_naming_the_closest_one(sagas: Sagas) -> None:
    with pytest.raises(SagaConfigurationError, match="did you mean idempotent="):
        sagas.compensator(idempotant=True)(lambda: None)


def test_an_option_nothing_resembles_is_refused_listing_the_saga_options(sagas: Sagas) -> None:
    with pytest.raises(SagaConfigurationError, match=r"zzz=.*not_committed_on"):
        sagas.step(compensate=None, zzz=1)(lambda: None)


@pytest.mark.parametrize("option", [{"queue": "q"}, {"soft_time_limit": 5}, {"rate_limit": "1/s"},
                                    {"priority": 3}, {"ignore_result": True}, {"bind": True}])
def test_celery_task_options_still_pass_through(sagas: Sagas, option: dict[str, Any]) -> None:
    def body(*args: Any) -> None:
        return None

    task = sagas.step(compensate=None, name=f"opt.{next(iter(option))}", **option)(body)
    assert task.name in sagas.app.tasks


@pytest.mark.parametrize(("decorator", "own"), [("step", STEP_OPTIONS),
                                                ("compensator", COMPENSATOR_OPTIONS)])
def test_the_saga_options_list_is_the_decorator_s_keywords(decorator: str, own: tuple[str, ...]) -> None:
    # A new saga option is a keyword of the decorator and a name in _definitions' tuple.
    parameters = inspect.signature(getattr(Sagas, decorator)).parameters.values()
    keywords = {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == set(own)
