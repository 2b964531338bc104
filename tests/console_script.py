"""The installed `tb-layergrad` console script, found beside this interpreter.

Why not by name: the suite also runs from a venv that is not activated (`/tmp/fresh/bin/python -m pytest`),
where the venv's scripts are not on PATH.
"""

from __future__ import annotations

import shutil
import sysconfig

CLI = shutil.which("tb-layergrad", path=sysconfig.get_path("scripts")) or "tb-layergrad"
