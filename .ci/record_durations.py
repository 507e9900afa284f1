"""Write tests/durations.json, the test order a fresh clone starts from (conftest.py), from
this clone's pytest cache: each test's seconds (setup, call and teardown) as the last runs of
the test command and the slow tier measured them, the tests of 0.5 s or more, to 0.1 s.

Run both tiers first (``python -m pytest`` and ``python -m pytest -m slow --dist
loadgroup``), then ``python .ci/record_durations.py``.
"""

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
CACHE = ROOT / ".pytest_cache" / "v" / "dmimo_jax" / "durations"
OUT = ROOT / "tests" / "durations.json"
SHORTEST_S = 0.5


def main() -> int:
    try:
        seconds = json.loads(CACHE.read_text())
    except (OSError, ValueError) as err:
        print(f"no measured durations at {CACHE}: run the tests first ({err})", file=sys.stderr)
        return 1
    kept = {k: round(v, 1) for k, v in sorted(seconds.items()) if v >= SHORTEST_S}
    OUT.write_text(json.dumps(kept, indent=0) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(kept)} of {len(seconds)} tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
