import os
import stat

import pytest

from open1b.node.config import ConfigError, NodeConfig, load_config, render_config, write_config
from open1b.node.datadir import DaemonLock, DataDirError, check_version, init_data_dir
from open1b.node.identity_file import KeyFileError, key_path, load_identity
from open1b.protocol import Identity


def _mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_init_creates_private_key_config_and_version(tmp_path):
    d = tmp_path / "node"
    first = init_data_dir(d)
    assert first.created_key and first.wrote_config
    assert _mode(key_path(d)) == 0o600 and _mode(key_path(d).parent) == 0o700
    assert _mode(d / "config.toml") == 0o600
    assert (d / "version").read_text().strip() == "1"
    assert load_identity(d).peer_id == first.peer_id


def test_init_never_overwrites_key_or_config(tmp_path):
    d = tmp_path / "node"
    first = init_data_dir(d)
    (d / "config.toml").write_text('[node]\nredundancy = 3\n')
    again = init_data_dir(d)
    assert not again.created_key and not again.wrote_config
    assert again.peer_id == first.peer_id
    assert load_config(d).redundancy == 3


def test_malformed_key_is_a_typed_error(tmp_path):
    d = tmp_path / "node"
    init_data_dir(d)
    key_path(d).write_bytes(b"short")
    with pytest.raises(KeyFileError, match="32 bytes"):
        load_identity(d)


def test_other_layout_version_is_refused(tmp_path):
    d = tmp_path / "node"
    init_data_dir(d)
    (d / "version").write_text("99\n")
    with pytest.raises(DataDirError, match="layout version"):
        check_version(d)


def test_lock_excludes_a_second_daemon(tmp_path):
    with DaemonLock(tmp_path):
        with pytest.raises(DataDirError, match=f"pid {os.getpid()}"):
            with DaemonLock(tmp_path):
                pass
    with DaemonLock(tmp_path):  # released on exit
        pass


def test_config_roundtrip_and_strictness(tmp_path):
    peer = Identity(bytes(32)).peer_id
    config = NodeConfig(data_dir=tmp_path, listen="127.0.0.1:4801", bootstrap=(f"/ip4/1.2.3.4/tcp/1/p2p/{peer}",),
                        redundancy=3, lease_s=300, audit=False, device="cuda:1", answer_s=30.0,
                        spot_checks=False, spot_checks_in_flight=3)
    write_config(config)
    assert load_config(tmp_path) == config
    assert "redundancy = 3" in render_config(config)
    for bad, message in [('[node]\nredundancy = "two"\n', "must be an integer"), ('[node]\nredundnacy = 2\n', "unknown key"),
                         ('[other]\nx = 1\n', "unknown section"), ('[node]\nlisten = "nohostport"\n', "HOST:PORT"),
                         ('[node]\nbootstrap = ["/ip4/1.2.3.4/tcp/1"]\n', "/p2p/"), ("[node\n", "config.toml"),
                         # a malformed peer ID is refused at start, not dialled (and retried) forever
                         ('[node]\nbootstrap = ["/ip4/1.2.3.4/tcp/1/p2p/12D3KooWX"]\n', "is not /ip4/HOST"),
                         ('[node]\ndevice = "gpu"\n', "device must be auto, cpu, cuda or cuda:N"),
                         ('[node]\ndevice = 0\n', "node.device must be a string"),
                         # a verifier may wait less than the spec's ANSWER_SECONDS, never more
                         ('[node]\nanswer_seconds = 3601\n', "answer_seconds must be in"),
                         ('[node]\nspot_checks = 1\n', "node.spot_checks must be true or false"),
                         ('[node]\nspot_checks_in_flight = 0\n', "spot_checks_in_flight must be in"),
                         ('[node]\nspot_checks_in_flight = 9\n', "spot_checks_in_flight must be in")]:
        (tmp_path / "config.toml").write_text(bad)
        with pytest.raises(ConfigError, match=message):
            load_config(tmp_path)


def test_missing_config_means_defaults(tmp_path):
    assert load_config(tmp_path) == NodeConfig(data_dir=tmp_path)


@pytest.mark.parametrize("line, message", [
    ("sync_interval_seconds = nan", r"node.sync_interval_seconds must be in \[1.0, 86400.0\], got nan"),
    ("sync_interval_seconds = inf", r"node.sync_interval_seconds must be in \[1.0, 86400.0\], got inf"),
    ("sync_interval_seconds = 0", r"node.sync_interval_seconds must be in \[1.0, 86400.0\], got 0.0"),
    ("redundancy = 100000000000000000000", r"node.redundancy must be in \[1, 256\]"),
    ("redundancy = 1e20", "node.redundancy must be an integer"),
    ("redundancy = 0", r"node.redundancy must be in \[1, 256\], got 0"),
    ("max_rejects_per_peer = 0", r"node.max_rejects_per_peer must be in \[1, "),
    ("max_rejects_per_peer = -1", r"node.max_rejects_per_peer must be in \[1, "),
    ("replay_timeout_seconds = -1", r"node.replay_timeout_seconds must be in \(0, 604800.0\], got -1.0"),
    ("replay_timeout_seconds = nan", r"node.replay_timeout_seconds must be in \(0, "),
    ("replay_timeout_seconds = 0", r"node.replay_timeout_seconds must be in \(0, "),
    ("blob_cache_bytes = -1", r"node.blob_cache_bytes must be in \[0, "),
    ("disk_reserve_bytes = -1", r"node.disk_reserve_bytes must be in \[0, "),
    ("lease_seconds = 0", r"node.lease_seconds must be in \[1, 3600\]"),
    ("answer_seconds = -inf", r"node.answer_seconds must be in \(0, 3600\]"),
    ("earn_trust_matches = 0", r"node.earn_trust_matches must be in \[1, "),
])
def test_numbers_out_of_range_are_refused_naming_the_key_and_the_range(tmp_path, line, message):
    (tmp_path / "config.toml").write_text(f"[node]\n{line}\n")
    with pytest.raises(ConfigError, match=message) as refused:
        load_config(tmp_path)
    assert "\n" not in str(refused.value)


@pytest.mark.integration  # runs the daemon command (refused before it listens)
def test_a_nan_in_config_toml_stops_the_daemon_in_one_line(tmp_path):
    from .commands import cli

    (tmp_path / "config.toml").write_text("[node]\nsync_interval_seconds = nan\n")
    rc, out, err = cli("daemon", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0", "--api", "127.0.0.1:0",
                       "--no-audit", timeout=60)
    assert rc == 1 and "Traceback" not in err and err.strip().splitlines()[-1].endswith(
        "node.sync_interval_seconds must be in [1.0, 86400.0], got nan"), err
    assert len(err.strip().splitlines()) == 1, err
