"""The bulk path towards a provider behind NAT (devnet/nat_topology.py; needs root, iproute2 and
iptables): a provider at home, behind a router that drops unsolicited inbound connections and
forwards no port, has dialled a fetcher on the internet over libp2p; nobody can dial its bulk
listener, so the fetcher asks it to dial back, and the checkpoint arrives over that session, every
chunk checked against h_k and the whole file against its address."""

import dataclasses
import os
import pickle
import shutil
import subprocess

import pytest

from open1b.deterministic.config import PRESETS
from open1b.deterministic.runfile import checkpoint_path, save_checkpoint
from open1b.deterministic.state import init_state
from open1b.devnet.nat_topology import HomeSpec, NatTopology
from open1b.node.blobs import BlobCache
from open1b.node.chunk_table import compute_table, state_expectation
from open1b.protocol.hashing import blake2b256

from .bulk_dialback_node import seeded
from .site_procs import read_line, spawn

PORT = 4821

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("iptables"),
                                reason="needs root, iproute2 and iptables")


def _node(site, seed: int, *args: str) -> subprocess.Popen:
    return spawn(site, "tests.node.bulk_dialback_node", seed, "--listen", f"{site.address}:{PORT}", *args)




@pytest.mark.integration
def test_a_provider_behind_nat_dials_the_fetcher_back_and_the_checkpoint_arrives_checked(tmp_path):
    state = init_state(dataclasses.replace(PRESETS["small"].config, n_layers=1), seed=5)
    address = save_checkpoint(tmp_path / "run", state)
    expect = state_expectation(state, address, prev=blake2b256(b"test-genesis"))
    provider_cache = BlobCache(tmp_path / "provider", 1 << 34)
    source = checkpoint_path(tmp_path / "run", 0)
    shutil.copyfile(source, provider_cache.path(address))
    provider_cache.store_table(address, compute_table(source))
    (tmp_path / "expect").write_bytes(pickle.dumps(expect))
    procs: list[subprocess.Popen] = []
    with NatTopology([HomeSpec("a", uplink_mbit=None)]) as net:
        try:
            fetcher = _node(net.internet, 1, "--fetch", str(tmp_path / "fetcher"), str(tmp_path / "expect"),
                            "--provider", seeded(2).peer_id)
            procs.append(fetcher)
            fetcher_addr = read_line(fetcher, 60)["addr"]
            provider = _node(net.homes["a"], 2, "--serve", str(tmp_path / "provider"), "--dial", fetcher_addr)
            procs.append(provider)
            read_line(provider, 60)
            got = read_line(fetcher, 120)
            assert got == {"provider": "DialBackPeer", "dialled_back": [seeded(2).peer_id],
                           "bytes_by_peer": {seeded(2).peer_id: got["bytes_by_peer"].get(seeded(2).peer_id, 0)},
                           "address_ok": True}, got
            assert got["bytes_by_peer"][seeded(2).peer_id] > 0
        finally:
            for proc in procs:
                proc.kill()
                proc.wait(timeout=10)
