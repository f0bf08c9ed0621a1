"""Build hook: `pip install ./python` runs cargo on ../ffi and places libbraid
inside the `braid` package (see README.md for why ctypes and not an extension)."""

from setuptools import setup
from setuptools_rust import Binding, RustExtension

setup(
    rust_extensions=[
        RustExtension(
            "braid._libbraid",
            path="../ffi/Cargo.toml",
            binding=Binding.NoBinding,
            # The library does not link libpython: one build serves every Python 3.
            py_limited_api=True,
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp38"}},
)
