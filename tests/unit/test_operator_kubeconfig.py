"""Where the operator's credentials come from (io/kubeconfig.py): kubectl's rules for KUBECONFIG lists and paths."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_operator.io import kubeconfig


def write(path: Path, document: dict[str, Any]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document))
    return str(path)


def test_relative_paths_resolve_against_the_file_that_holds_them(tmp_path: Path) -> None:
    first = write(
        tmp_path / "a" / "config",
        {
            "current-context": "c",
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            "clusters": [{"name": "k", "cluster": {"server": "https://k", "certificate-authority": "ca.crt"}}],
        },
    )
    second = write(
        tmp_path / "b" / "config",
        {
            "users": [
                {
                    "name": "u",
                    "user": {
                        "client-certificate": "certs/me.crt",
                        "client-key": "/abs/me.key",
                        "tokenFile": "token",
                        "exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "./bin/plugin"},
                    },
                }
            ],
        },
    )
    config = kubeconfig.load_kubeconfig(os.pathsep.join([first, second]))
    assert config.cluster.certificate_auth == str(tmp_path / "a" / "ca.crt")
    assert config.user is not None
    assert config.user.client_cert == str(tmp_path / "b" / "certs" / "me.crt")
    assert config.user.client_key == "/abs/me.key"
    assert config.user.token_file == str(tmp_path / "b" / "token")
    assert config.user.exec is not None and config.user.exec.command == str(tmp_path / "b" / "bin" / "plugin")


def test_a_bare_plugin_name_stays_a_path_lookup(tmp_path: Path) -> None:
    exec_spec = {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws", "args": ["eks", "get-token"]}
    path = write(
        tmp_path / "config",
        {
            "current-context": "c",
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            "clusters": [{"name": "k", "cluster": {"server": "https://k"}}],
            "users": [{"name": "u", "user": {"exec": exec_spec}}],
        },
    )
    config = kubeconfig.load_kubeconfig(path)
    assert config.user is not None and config.user.exec is not None and config.user.exec.command == "aws"
    assert isinstance(kubeconfig.credentials_for(config.user), kubeconfig.ExecPlugin)


def test_an_unknown_exec_api_version_or_context_is_refused_at_start(tmp_path: Path) -> None:
    path = write(
        tmp_path / "config",
        {
            "current-context": "c",
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            "clusters": [{"name": "k", "cluster": {"server": "https://k"}}],
            "users": [{"name": "u", "user": {"exec": {"apiVersion": "example.com/v9", "command": "x"}}}],
        },
    )
    config = kubeconfig.load_kubeconfig(path)
    with pytest.raises(kubeconfig.ConfigError, match=r"apiVersion 'example\.com/v9'"):
        kubeconfig.credentials_for(config.user)
    with pytest.raises(kubeconfig.ConfigError, match="Context 'other' not found"):
        kubeconfig.load_kubeconfig(path, context="other")


async def test_kopfs_login_gets_data_over_a_path_as_kubectl_does(tmp_path: Path) -> None:
    path = write(
        tmp_path / "config",
        {
            "current-context": "c",
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            "clusters": [
                {"name": "k", "cluster": {"server": "https://k", "certificate-authority": "ca.crt",
                                          "certificate-authority-data": "Q0E="}}
            ],
            "users": [{"name": "u", "user": {"client-key": "me.key", "client-key-data": "S0VZ", "token": "t"}}],
        },
    )  # fmt: skip
    config = kubeconfig.load_kubeconfig(path)
    info = await kubeconfig.connection_info(
        config, kubeconfig.credentials_for(config.user), trust_env=False, refresh=False
    )
    assert (info.ca_path, info.ca_data) == (None, "Q0E=")  # kopf refuses a ConnectionInfo with both
    assert (info.private_key_path, info.private_key_data, info.token) == (None, "S0VZ", "t")
    assert info.default_namespace is None and info.server == "https://k"
