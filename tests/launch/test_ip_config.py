"""ip_config parsing: one machine per line, comments and blank lines allowed."""

from __future__ import annotations

import pytest

from distgnn.launch.ip_config import DEFAULT_PORT, IpConfigError, Machine, parse_ip_config, read_ip_config


def test_lines_comments_and_default_port():
    text = "# cluster\n10.0.0.1 5000\n\n  10.0.0.2   # second machine\n::1 7000\n"
    assert parse_ip_config(text) == [Machine("10.0.0.1", 5000), Machine("10.0.0.2", DEFAULT_PORT), Machine("::1", 7000)]
    assert Machine("10.0.0.1", 5000).server_address(2) == ("10.0.0.1", 5002)


@pytest.mark.parametrize(
    "text, message",
    [
        ("10.0.0.1 5000 extra\n", r"ip_config:1: expected 'IP \[PORT\]'"),
        ("host-a 5000\n", "'host-a' is not an IP address"),
        ("10.0.0.1\n10.0.0.2 http\n", "ip_config:2: port 'http'"),
        ("10.0.0.1 70000\n", "port '70000'"),
        ("# nothing\n\n", "no machines listed"),
    ],
)
def test_bad_lines_name_the_line(text, message):
    with pytest.raises(IpConfigError, match=message):
        parse_ip_config(text)


def test_missing_file(tmp_path):
    with pytest.raises(IpConfigError, match="cannot read ip_config"):
        read_ip_config(tmp_path / "missing.txt")
