"""JobConfig: built from arguments or the launcher's environment, validated once."""

from __future__ import annotations

import pytest

from distgnn.config import JobConfig
from distgnn.errors import ConfigError
from distgnn.launch import env as E


@pytest.fixture
def ip_config(tmp_path):
    path = tmp_path / "ip_config.txt"
    path.write_text("127.0.0.1 4000\n127.0.0.1 4010\n")
    return path


def test_env_round_trip(ip_config, tmp_path):
    cfg = JobConfig.create(ip_config, tmp_path / "g.json", machine_id=1, num_servers=2, num_trainers=3, curve=True)
    again = JobConfig.from_env(cfg.to_env())
    assert again == cfg
    assert again.server_address(1, 1) == ("127.0.0.1", 4011)


def test_fresh_token_and_job_id_per_job(ip_config):
    a, b = JobConfig.create(ip_config), JobConfig.create(ip_config)
    assert a.token != b.token and a.job_id != b.job_id
    assert len(a.token) >= 32


def test_overrides_win_over_environment(ip_config):
    env = JobConfig.create(ip_config, num_trainers=1).to_env()
    assert JobConfig.from_env(env, num_trainers=4).num_trainers == 4


@pytest.mark.parametrize(
    "changes, message",
    [
        ({E.MACHINE_ID: "2"}, "machine id 2 out of range"),
        ({E.NUM_SERVERS: "x"}, "DISTGNN_NUM_SERVERS must be an integer"),
        ({E.TOKEN: ""}, "no job token"),
        ({E.RPC_TIMEOUT: "soon"}, "DISTGNN_RPC_TIMEOUT must be a number"),
        ({E.ROLE: "worker"}, "role must be"),
        ({E.SERVER_ID: "1"}, "server id 1 out of range"),
    ],
)
def test_bad_environment_is_named(ip_config, changes, message):
    env = JobConfig.create(ip_config).to_env()
    env.update(changes)
    with pytest.raises(ConfigError, match=message):
        JobConfig.from_env(env)


def test_missing_ip_config_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read ip_config"):
        JobConfig.create(tmp_path / "nope.txt")
    with pytest.raises(ConfigError, match="no ip_config"):
        JobConfig.from_env({})
