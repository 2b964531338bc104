"""Install tb_layergrad: capture, summary ops and the TensorBoard plugin.

TensorFlow is not a hard requirement because users install it under different
distribution names (tensorflow, tensorflow-cpu, tensorflow-macos...) and pip
would otherwise pull a second copy. The TensorBoard plugin itself needs no
TensorFlow at all. For the same reason the `test` extra holds test tools only:
`[cpu,test]` on a fresh machine, `[test]` beside an installed TensorFlow.
"""

import ast
import pathlib

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).resolve().parent


def package_version() -> str:
    """`tb_layergrad.__version__`, the one version source, read without importing the package."""
    tree = ast.parse((HERE / "tb_layergrad" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise RuntimeError("tb_layergrad/__init__.py defines no __version__")


# Supported ranges (README, "Supported versions"): CI tests both ends, the oldest pinned and the newest as
# released that day. The upper bounds are the next major versions, not the newest tested minor: GradientLogger
# observes Keras' own train step instead of copying it, and the plugin reads TensorBoard through its public
# data provider (the one private read has a public fallback, plugin/listing.py), so a new minor is expected to
# work, while capping at a minor would hold back every user's TensorFlow on the day it is released.
TENSORFLOW = ">=2.16,<3"
KERAS = "keras>=3.3,<4"
# GradientLogger on JAX writes its event files without TensorFlow: this extra installs none.
JAX = "jax>=0.10"  # the oldest tested: CI's JAX leg runs the newest release

TEST_REQUIRES = [
    "pytest>=7",
    "pytest-timeout>=2",
    "werkzeug>=2",
    "hypothesis>=6",
    "playwright>=1.40",
    "pandas>=1.5",
    # tests/keras/test_tuner.py: a KerasTuner search with GradientLogger (1.4: its first release for Keras 3).
    "keras-tuner>=1.4,<2",
    # The artifact tests build the sdist and the wheel as a release would: in build's isolated environment, with
    # pyproject.toml's build requirements (not here: a newer setuptools in the test venv has no pkg_resources,
    # which TensorBoard 2.16 imports at start-up).
    "build>=1",
    "twine>=5",
    # Lint and format (pyproject.toml); a minor of its own because a new ruff minor may reformat.
    "ruff>=0.17,<0.18",
]

setup(
    name="tb-layergrad",
    version=package_version(),
    description="Gradients w.r.t. layer outputs for TF2/Keras, logged to TensorBoard with its own tab.",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",  # TensorFlow 2.16's oldest Python; CI tests 3.9 (oldest pair) and 3.11
    packages=find_packages(include=["tb_layergrad", "tb_layergrad.*"]) + ["tb_layergrad.frontend"],
    package_dir={"tb_layergrad.frontend": "frontend"},
    # Everything under frontend/ (nested ES modules, styles, vendored libraries and their licences).
    package_data={"tb_layergrad.frontend": ["**/*"], "tb_layergrad.kernel": ["src/*.cc", "src/*.h"]},
    install_requires=[
        "tensorboard>=2.16,<3",
        "numpy>=1.23",
        "protobuf>=3.20",
        "filelock>=3.12",  # the kernel build's lock, on every OS (no fcntl)
        "platformdirs>=3",  # the kernel cache's folder, per OS
        # The event files' checksums in C, read and written (metadata/tf_record.py; numpy where its C extension
        # is missing): wheels for Linux, macOS and Windows, no TensorFlow.
        "google-crc32c>=1.5",
    ],
    extras_require={
        "cpu": [f"tensorflow-cpu{TENSORFLOW}", KERAS],
        "tf": [f"tensorflow{TENSORFLOW}", KERAS],
        "jax": [JAX, KERAS],
        "pandas": ["pandas>=1.5"],
        "test": TEST_REQUIRES,
    },
    entry_points={
        "tensorboard_plugins": ["layergrad = tb_layergrad.plugin.loader:LayerGradLoader"],
        "console_scripts": ["tb-layergrad = tb_layergrad.cli:main"],
    },
    classifiers=[
        "Development Status :: 5 - Production/Stable",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "License :: OSI Approved :: Apache Software License",
        "Operating System :: OS Independent",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.9",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: Scientific/Engineering :: Visualization",
    ],
)
