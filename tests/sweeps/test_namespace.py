"""The package root, `speclab`, has no side effects on import."""

import json
import os
import subprocess
import sys

# The environment before and after `import speclab`, and every file the import opened that
# is not Python code (a module reading the machine, say /proc/cpuinfo, shows here).
IMPORT_SPECLAB = """
import json, os, sys
opened = []
def note(event, args):
    if event == "open" and isinstance(args[0], str) and not args[0].endswith((".py", ".pyc")):
        opened.append(args[0])
before = dict(os.environ)
sys.addaudithook(note)
import speclab
print(json.dumps({"before": before, "after": dict(os.environ), "opened": opened}))
"""


def test_importing_speclab_leaves_the_process_unchanged():
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}  # as a fresh process sees it
    out = subprocess.run([sys.executable, "-c", IMPORT_SPECLAB], env=env, capture_output=True, text=True,
                         check=True)
    seen = json.loads(out.stdout)
    assert seen["after"] == seen["before"]
    assert seen["opened"] == []
