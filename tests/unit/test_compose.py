"""compose/: no Docker engine runs here, so the files are checked instead of started.

The compose file must parse, define redis (append-only), postgres, worker, beat and web, each
with a health check, and every command it runs must name something that exists: the modules
given to ``-A``/``--app`` import and hold the right app, ``celery`` and ``flask`` are installed
console scripts with those subcommands, and the services' URLs name services of the file.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
DOCKERFILE = ROOT / "compose" / "Dockerfile"
SERVICES = {"redis", "postgres", "worker", "beat", "web"}
SHOP_SERVICES = ("worker", "beat", "web")
SECRET_CHECK = "approval-secret"
DOCKERIGNORE = ROOT / ".dockerignore"
# Executables that come with each service's image (shell builtins need no image).
IMAGE_TOOLS = {"redis": {"redis-server", "redis-cli"}, "postgres": {"pg_isready"}}
SHOP_TOOLS = {"celery", "flask", "python"}
BUILTINS = {"kill"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The parsed compose file."""
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture
def shop_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Import the example without reaching any service."""
    monkeypatch.setenv("SHOP_BROKER", "memory://localhost/")
    monkeypatch.setenv("SHOP_STORE", "memory://")


def argv(command: Any) -> list[str]:
    """A compose command (list or string) as an argument vector."""
    return list(command) if isinstance(command, list) else shlex.split(command)


def healthcheck_argv(test: Any) -> list[str]:
    """The argument vector a health check runs (CMD: as given; CMD-SHELL: split like sh)."""
    words = argv(test)
    if words[0] == "CMD":
        return words[1:]
    assert words[0] == "CMD-SHELL", words
    return shlex.split(" ".join(words[1:]))


def commands(service: dict[str, Any]) -> list[list[str]]:
    """Every argument vector a service runs: its command and its health check."""
    found = [healthcheck_argv(service["healthcheck"]["test"])] if "healthcheck" in service else []
    if "command" in service:
        found.append(argv(service["command"]))
    return found


def option(words: list[str], *names: str) -> str:
    """The value of the first of ``names`` in ``words``."""
    for index, word in enumerate(words):
        if word in names:
            return words[index + 1]
    raise AssertionError(f"no {'/'.join(names)} in {words}")


def test_the_file_defines_every_service_with_a_health_check(compose: dict[str, Any]) -> None:
    # then
    assert set(compose["services"]) >= SERVICES
    for name in SERVICES:
        check = compose["services"][name].get("healthcheck", {})
        assert check.get("test"), f"{name} has no health check"
        assert argv(check["test"])[0] in ("CMD", "CMD-SHELL"), name


def test_redis_keeps_an_append_only_file(compose: dict[str, Any]) -> None:
    # when
    words = argv(compose["services"]["redis"]["command"])

    # then
    assert words[0] == "redis-server"
    assert option(words, "--appendonly") == "yes"
    assert option(words, "--appendfsync") == "everysec"


def test_the_shop_services_run_the_example_processes(compose: dict[str, Any]) -> None:
    # when
    run = {name: argv(compose["services"][name]["command"]) for name in SHOP_SERVICES}

    # then
    assert run["worker"][:4] == ["celery", "-A", "examples.shop.app", "worker"]
    assert run["beat"][:4] == ["celery", "-A", "examples.shop.app", "beat"]
    assert run["web"][:3] == ["flask", "--app", "examples.shop.web"]
    assert option(run["web"], "--host") == "0.0.0.0"


def test_every_executable_comes_with_its_service_image(compose: dict[str, Any]) -> None:
    # then
    for name, service in compose["services"].items():
        image = str(service.get("image", ""))
        tools = next((t for prefix, t in IMAGE_TOOLS.items() if image.startswith(prefix)), None)
        allowed = (tools if tools is not None else SHOP_TOOLS) | BUILTINS
        for words in commands(service):
            assert words[0] in allowed, f"{name} runs {words[0]!r}, not in its image {image!r}"


def test_celery_and_flask_are_installed_console_scripts() -> None:
    # when
    scripts = {e.name for e in importlib.metadata.entry_points(group="console_scripts")}

    # then
    assert {"celery", "flask", "celery-sagas"} <= scripts
    for name in ("celery", "flask"):
        assert (Path(sys.executable).parent / name).exists(), name


@pytest.mark.usefixtures("shop_env")
def test_every_celery_command_names_an_app_module_and_a_subcommand(compose: dict[str, Any]) -> None:
    # given
    from celery import Celery
    from celery.bin.celery import celery as celery_root

    from celery_sagas._celery.facade import sagas_of

    # then
    checked = 0
    for service in compose["services"].values():
        for words in commands(service):
            if words[0] != "celery":
                continue
            module = importlib.import_module(option(words, "-A", "--app"))
            app = module.app
            assert isinstance(app, Celery)
            assert sagas_of(app) is module.sagas
            subcommand = words[words.index(option(words, "-A", "--app")) + 1]
            assert subcommand in celery_root.commands, subcommand
            checked += 1
    assert checked >= 3  # worker, its health check, beat


@pytest.mark.usefixtures("shop_env")
def test_the_flask_command_names_the_web_app(compose: dict[str, Any]) -> None:
    # given
    from flask import Flask
    from flask.cli import cli as flask_root

    words = argv(compose["services"]["web"]["command"])

    # when
    module = importlib.import_module(option(words, "--app"))

    # then
    assert isinstance(module.app, Flask)
    assert words[3] in flask_root.commands


def test_inline_python_in_health_checks_compiles(compose: dict[str, Any]) -> None:
    # then
    for name, service in compose["services"].items():
        for words in commands(service):
            if words[0] == "python":
                compile(option(words, "-c"), f"<{name} healthcheck>", "exec")


def test_the_worker_health_check_pings_the_worker_by_its_name(compose: dict[str, Any]) -> None:
    # given
    worker = compose["services"]["worker"]
    name = option(argv(worker["command"]), "-n")
    check = healthcheck_argv(worker["healthcheck"]["test"])

    # then: compose turns $$ into $, so the shell sees worker@$HOSTNAME for worker@%h
    assert name == "worker@%h"
    assert option(check, "--destination") == "worker@$$HOSTNAME"


def test_the_shop_services_point_at_services_of_this_file(compose: dict[str, Any]) -> None:
    # then
    for name in SHOP_SERVICES:
        service = compose["services"][name]
        env = service["environment"]
        broker, store = urlsplit(env["SHOP_BROKER"]), urlsplit(env["SHOP_STORE"])
        assert (broker.scheme, broker.hostname) == ("redis", "redis"), name
        assert (store.scheme, store.hostname) == ("postgresql+psycopg", "postgres"), name
        for dependency, condition in service["depends_on"].items():
            assert dependency in compose["services"], dependency
            wanted = "service_completed_successfully" if dependency == SECRET_CHECK else \
                "service_healthy"
            assert condition == {"condition": wanted}


def test_the_shop_image_is_built_from_the_repository(compose: dict[str, Any]) -> None:
    # then
    for name in SHOP_SERVICES:
        build = compose["services"][name]["build"]
        context = (COMPOSE.parent / build["context"]).resolve()
        assert context == ROOT
        assert (context / build["dockerfile"]).resolve() == DOCKERFILE


def test_the_dockerfile_installs_the_package_with_its_extras() -> None:
    # given
    lines = [line.strip() for line in DOCKERFILE.read_text().splitlines()]
    extras = set(importlib.metadata.metadata("celery-sagas").get_all("Provides-Extra") or [])

    # then
    assert "FROM python:3.11-slim" in lines
    assert 'RUN pip install ".[postgres,web]"' in lines
    assert {"postgres", "web"} <= extras
    for line in lines:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source


# ---------------------------------------------------------------- no secret needed but by `up`

# What compose interpolates: $$ (a literal $), $NAME, ${NAME}, ${NAME:-default}, ${NAME-default},
# ${NAME:?error}, ${NAME?error}; anything else after a $ is an invalid template.
_DOLLAR = re.compile(r"\$(\$|[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*(?:(:?[-?])[^}]*)?\}|)")


def strings(value: Any) -> list[str]:
    """Every string of the parsed file (keys and values: compose interpolates both)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in strings(k) + strings(v)]
    if isinstance(value, list):
        return [s for item in value for s in strings(item)]
    return []


def test_every_dollar_in_the_file_is_a_valid_interpolation(compose: dict[str, Any]) -> None:
    # then: `docker compose config` (and every other command) can parse the file
    for text in strings(compose):
        for match in _DOLLAR.finditer(text):
            assert match.group(1), f"invalid interpolation in {text!r}"


def test_no_variable_is_mandatory_so_logs_exec_and_down_work_without_the_secret(
    compose: dict[str, Any],
) -> None:
    # then: a ${VAR:?} or ${VAR?} would fail every compose command in a shell without VAR
    for text in strings(compose):
        for match in _DOLLAR.finditer(text):
            assert "?" not in match.group(0), f"mandatory variable: {match.group(0)}"


def test_up_waits_for_the_approval_secret_check(compose: dict[str, Any]) -> None:
    # then
    check = compose["services"][SECRET_CHECK]
    assert check["environment"]["SHOP_APPROVAL_SECRET"] == "${SHOP_APPROVAL_SECRET:-}"
    assert check["restart"] == "no"
    for name in SHOP_SERVICES:
        condition = compose["services"][name]["depends_on"][SECRET_CHECK]
        assert condition == {"condition": "service_completed_successfully"}


@pytest.mark.parametrize(("secret", "code"), [(None, 1), ("", 1), ("x" * 31, 1), ("x" * 32, 0)],
                         ids=["unset", "empty", "short", "enough"])
def test_the_secret_check_fails_unless_the_secret_has_32_bytes(
    compose: dict[str, Any], secret: str | None, code: int
) -> None:
    # given
    words = argv(compose["services"][SECRET_CHECK]["command"])
    env = {k: v for k, v in os.environ.items() if k != "SHOP_APPROVAL_SECRET"}
    if secret is not None:
        env["SHOP_APPROVAL_SECRET"] = secret

    # when
    done = subprocess.run([sys.executable, *words[1:]], env=env, capture_output=True, text=True,
                          timeout=60, check=False)

    # then
    assert words[0] == "python"
    assert done.returncode == code
    if code:
        assert "export it (32+ random bytes) before docker compose up" in done.stderr


# ---------------------------------------------------------------- the build context


def ignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` (relative, ``/``-separated) out of the context:
    the last pattern matching the path or one of its parent folders wins."""
    parts = path.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    verdict = False
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        globbed = pattern.replace("**/", "")
        for candidate in candidates:
            name = candidate.rsplit("/", 1)[-1]
            deep = pattern.startswith("**/") and fnmatch.fnmatch(name, globbed)
            if fnmatch.fnmatch(candidate, pattern) or deep:
                verdict = not negated
                break
    return verdict


@pytest.mark.parametrize("path", [".git/HEAD", ".venv/bin/python", "tests/unit/test_cli.py",
                                  "bench/results/x.json", "site/index.html", ".mypy_cache/x",
                                  "celery_sagas/__pycache__/cli.cpython-311.pyc",
                                  "examples/shop/provider.db"])
def test_the_build_context_leaves_out(path: str) -> None:
    assert ignored(path), path


def test_the_build_context_keeps_everything_the_dockerfile_copies() -> None:
    # given
    copied = [word for line in DOCKERFILE.read_text().splitlines() if line.startswith("COPY ")
              for word in line.split()[1:-1]]

    # then
    assert copied == ["pyproject.toml", "README.md", "celery_sagas", "examples"]
    for source in copied:
        for path in [source] + [str(p.relative_to(ROOT)) for p in (ROOT / source).rglob("*.py")]:
            assert not ignored(path), path
