"""Run one of the repository's scripts in a fresh Python, as a user would."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parent.parent / "scripts"


def run_script(script: str, *args: str) -> str:
    """Run ``scripts/<script>`` with ``args``; its stdout (it must exit 0)."""
    # This checkout's edgespec, whatever an editable install elsewhere points at.
    env = {**os.environ, "PYTHONPATH": str(SCRIPTS.parent)}
    done = subprocess.run([sys.executable, str(SCRIPTS / script), *args], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout
