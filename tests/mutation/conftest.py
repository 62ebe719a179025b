"""Print the mutation test's count and kill rate in pytest's summary, where CI logs show it
(a passing test's own output is captured)."""

SUMMARY: list[str] = []


def pytest_terminal_summary(terminalreporter):
    for line in SUMMARY:
        terminalreporter.write_line(line)
