"""The fuzzing budget: bounded in CI, raised by ``bench/fuzz_long.py``.

``OPEN1B_FUZZ_EXAMPLES`` sets hypothesis' examples per property (default 200, what CI runs);
``OPEN1B_FUZZ_SEED`` replays one seed. No deadline: a slow example is not a failure, a crash is.
"""

import os

from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("OPEN1B_FUZZ_EXAMPLES", "200"))

FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])
