"""The one thing pyproject.toml cannot say: the log path's optional C inner loops.

``optional=True``: where no compiler is, the build says so and goes on, and dflashd runs the
same loops in Python (logs/linecodec.py; ``dflashd status`` names the one in use).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "dflashd.logs._lines",
            sources=["logs/_lines.c"],
            optional=True,
            extra_compile_args=["-O3"],
        )
    ]
)
