import subprocess
import sys


def test_protocol_imports_without_the_node_stack():
    code = (
        "import sys, open1b.protocol\n"
        "heavy = {'trio', 'libp2p', 'numba', 'torch', 'numpy', 'open1b.node', 'open1b.deterministic'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
