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
