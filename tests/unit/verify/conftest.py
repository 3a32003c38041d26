"""The verification scripts as they run on a host: gpu_verify copies files/verify/ and the shared
modules of plugins/module_utils (gpu_parsers.py, gpu_lock.py) into one folder, where the scripts
import them by name. Here both folders go on sys.path, and on PYTHONPATH for the scripts that the
tests run as commands."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT_PATH = [str(ROOT / "files" / "verify"), str(ROOT / "plugins" / "module_utils")]

for folder in reversed(SCRIPT_PATH):
    if folder not in sys.path:
        sys.path.insert(0, folder)
os.environ["PYTHONPATH"] = os.pathsep.join([*SCRIPT_PATH, *filter(None, [os.environ.get("PYTHONPATH")])])
