"""Install tb_layergrad: capture, summary ops and the TensorBoard plugin.

TensorFlow is not a hard requirement because users install it under different
distribution names (tensorflow, tensorflow-cpu, tensorflow-macos...) and pip
would otherwise pull a second copy. The TensorBoard plugin itself needs no
TensorFlow at all.
"""
from setuptools import find_packages, setup

TEST_REQUIRES = [
    "tensorflow-cpu>=2.16",
    "pytest>=7",
    "pytest-timeout>=2",
    "werkzeug>=2",
    "hypothesis>=6",
    "playwright>=1.40",
    "pandas>=1.5",
]

setup(
    name="tb_layergrad",
    version="0.1.0",
    description="Gradients w.r.t. layer outputs for TF2/Keras, logged to TensorBoard with its own tab.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["tb_layergrad", "tb_layergrad.*"]) + ["tb_layergrad.frontend"],
    package_dir={"tb_layergrad.frontend": "frontend"},
    # Everything under frontend/ (nested ES modules, styles, vendored libraries and their licences).
    package_data={"tb_layergrad.frontend": ["**/*"], "tb_layergrad": ["kernels/*.cc", "kernels/*.h"]},
    install_requires=["tensorboard>=2.16", "numpy>=1.23", "protobuf>=3.20"],
    extras_require={
        "cpu": ["tensorflow-cpu>=2.16"],
        "tf": ["tensorflow>=2.16"],
        "pandas": ["pandas>=1.5"],
        "test": TEST_REQUIRES,
    },
    entry_points={
        "tensorboard_plugins": ["layergrad = tb_layergrad.plugin.loader:LayerGradLoader"],
        "console_scripts": ["tb-layergrad = tb_layergrad.cli:main"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
