import subprocess
import sys


def test_protocol_imports_without_the_node_stack():
    """Every module of open1b.protocol, the Open-1B verifier included, imports with only the
    base install's dependencies."""
    code = (
        "import sys, pkgutil, importlib, open1b.protocol as p\n"
        "for m in pkgutil.iter_modules(p.__path__): importlib.import_module('open1b.protocol.' + m.name)\n"
        "heavy = {'trio', 'libp2p', 'numba', 'torch', 'numpy', 'safetensors', 'open1b.node', 'open1b.deterministic'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_referee_needs_numpy_only_to_re_execute():
    """open1b.protocol.dispute's modules that decode and check a proof import without numpy;
    judging a proof that is refused before its op is re-executed loads none either."""
    code = (
        "import sys\n"
        "from open1b.protocol.dispute import ops, proof, referee, trace\n"
        "print(referee.verify_fraud_proof(b'\\xa0').code)\n"
        "print(sorted({'numpy', 'numba', 'torch', 'trio', 'libp2p'} & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["kind", "[]"]
