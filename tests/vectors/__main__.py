"""``python -m tests.vectors``: regenerate every suite's files from the code (then review the diff)."""

from . import ROOT, SUITES, write

write()
print(f"wrote {len(SUITES)} suites under {ROOT}")
