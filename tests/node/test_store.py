import os
import signal
import subprocess
import sys
import textwrap

from open1b.node.store import Store
from tests.runs import attestation

from .conftest import ident

NOW = 1_800_000_000


def _atts(manifest, n_signers=3):
    return [attestation(ident(10 + i), run=manifest.run_id, step=k, pre_state=manifest.state_hashes[k],
                               post_state=manifest.state_hashes[k + 1], verdict="match", engine=manifest.engine,
                               engine_version=manifest.engine_version, hardware="t", device="cpu/x86_64-avx2", elapsed_ms=1, issued_at=NOW)
            for i in range(n_signers) for k in range(manifest.steps)]


def test_statements_are_a_set_and_survive_reopening(tmp_path, manifest):
    run_dir = tmp_path / "run"
    store = Store(tmp_path / "s.sqlite")
    assert store.add_manifest(manifest, run_dir)
    atts = _atts(manifest)
    assert all(store.add_attestation(a) for a in atts)
    assert not any(store.add_attestation(a) for a in atts)  # idempotent
    store.close()
    again = Store(tmp_path / "s.sqlite")
    assert {a.digest for a in again.attestations(manifest.run_id)} == {a.digest for a in atts}
    assert [a.step for a in again.attestations(manifest.run_id, 2)] == [2, 2, 2]
    signed = {a.step for a in again.attestations(manifest.run_id) if a.signer == ident(10).public_key}
    assert signed == set(range(manifest.steps))
    assert again.run_dir(manifest.run_id) == run_dir
    assert again.manifests() == [manifest]


def test_kill_9_loses_no_committed_statement(tmp_path, manifest):
    atts = _atts(manifest, n_signers=40)
    blob = tmp_path / "atts.bin"
    blob.write_bytes(b"".join(len(a.encoded).to_bytes(2, "little") + a.encoded for a in atts))
    writer = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from open1b.node.store import Store
        from open1b.protocol import Attestation
        data = Path({str(blob)!r}).read_bytes()
        store = Store(Path({str(tmp_path / 's.sqlite')!r}))
        i = 0
        while i < len(data):
            n = int.from_bytes(data[i:i + 2], 'little'); i += 2
            att = Attestation.decode(data[i:i + n]); i += n
            store.add_attestation(att)
            print(att.digest.hex(), flush=True)   # acknowledged only after the commit returned
            time.sleep(0.002)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
    acked = [proc.stdout.readline().strip() for _ in range(100)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = {a.digest.hex() for a in Store(tmp_path / "s.sqlite").attestations(manifest.run_id)}
    assert set(acked) <= kept


def test_a_batch_is_stored_in_one_transaction_and_says_which_were_new(tmp_path, manifest):
    store = Store(tmp_path / "s.sqlite")
    atts = _atts(manifest)
    assert store.add_attestation(atts[0])
    assert store.add_attestations([atts[1], atts[0], atts[2], atts[1]]) == [True, False, True, False]
    assert store.add_attestations([]) == []
    assert {a.digest for a in store.attestations(manifest.run_id)} == {a.digest for a in atts[:3]}
