"""Redis Sentinel settings: read as the worker needs them, refused in one line when wrong."""

from __future__ import annotations

import pytest

from service.config import ConfigError, load_settings

pytestmark = pytest.mark.usefixtures("clean_payauth_env")


def test_sentinels_are_read_as_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAYAUTH_REDIS_SENTINELS", "s1.example:26379, [::1]:26380,10.0.0.3:26381")
    monkeypatch.setenv("PAYAUTH_REDIS_SENTINEL_MASTER", "payauth")
    settings = load_settings()
    assert settings.sentinel_addresses() == [("s1.example", 26379), ("::1", 26380),
                                             ("10.0.0.3", 26381)]
    assert load_settings(redis_sentinels="").sentinel_addresses() == []


@pytest.mark.parametrize(("variables", "named"), [
    ({"PAYAUTH_REDIS_SENTINELS": "s1:26379"}, "PAYAUTH_REDIS_SENTINEL_MASTER"),
    ({"PAYAUTH_REDIS_SENTINELS": "s1", "PAYAUTH_REDIS_SENTINEL_MASTER": "m"},
     "PAYAUTH_REDIS_SENTINELS"),
    ({"PAYAUTH_REDIS_SENTINELS": "s1:99999", "PAYAUTH_REDIS_SENTINEL_MASTER": "m"},
     "PAYAUTH_REDIS_SENTINELS"),
    ({"PAYAUTH_REDIS_SENTINELS": "s1:", "PAYAUTH_REDIS_SENTINEL_MASTER": "m"},
     "PAYAUTH_REDIS_SENTINELS"),
    ({"PAYAUTH_REDIS_SENTINELS": "s1:26379", "PAYAUTH_REDIS_SENTINEL_MASTER": "m",
      "PAYAUTH_REDIS_URL": "unix:///run/redis.sock"}, "PAYAUTH_REDIS_SENTINELS"),
    ({"PAYAUTH_REDIS_URL": "redis://localhost:6379/cache"}, "PAYAUTH_REDIS_URL"),
])
def test_a_bad_sentinel_setting_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                            variables: dict[str, str], named: str) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=named) as caught:
        load_settings()
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("url", "expected"), [
    ("redis://localhost:6379/0",
     {"username": None, "password": None, "db": 0, "ssl": False}),
    ("rediss://payauth:p%40ss%3Aw0rd@ignored:6380/3",
     {"username": "payauth", "password": "p@ss:w0rd", "db": 3, "ssl": True}),
    ("redis://:only-a-password@ignored", {"username": None, "password": "only-a-password",
                                          "db": 0, "ssl": False}),
])
def test_the_masters_credentials_come_from_the_redis_url(url: str, expected: dict) -> None:
    # The worker's cache and the chaos checker both take these for the master the Sentinels
    # name: a client without them cannot read a protected master.
    from service.adapters.redis_cache import master_options

    assert master_options(url) == expected
