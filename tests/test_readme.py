"""The README's quickstart runs as written and writes what it promises."""
from __future__ import annotations

import pathlib
import re

import numpy as np

from tb_reading import read_all
from tolerances import TWO_SIDES, gamma

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def quickstart_code() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Quickstart") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_quickstart_is_short_and_runs(tmp_path, monkeypatch):
    code = quickstart_code()
    assert len([line for line in code.splitlines() if line.strip()]) <= 16
    monkeypatch.chdir(tmp_path)
    code = code.replace("range(100)", "range(3)")
    scope: dict = {}
    exec(compile(code, "README quickstart", "exec"), scope)
    recs = read_all(str(tmp_path / "logs"))["seed"]
    info, datums = recs["loss/output/my_model/minimalrnn/stats"]
    assert [d.step for d in datums] == [0, 1, 2]
    # The last logged step holds the norm of the gradient the script computed.
    grads = scope["grads"]
    g = grads["my_model/minimalrnn"].numpy()
    norm = np.linalg.norm(g)
    # Both sides: n squares (1 rounding each) summed in any order in float32 at worst (numpy here,
    # TensorFlow's path where the kernel is not built), a sqrt halving that and rounding once more.
    rtol = TWO_SIDES * (gamma(g.size, np.float32) / 2 + gamma(1, np.float32))
    np.testing.assert_allclose(datums[-1].numpy[9], norm, rtol=rtol)
