"""speclab: a speculator architecture experiment platform.

The installed package maps the repository's top-level folders under this namespace
(`speclab.speculator`, `speclab.kernels`, `speclab.training`, `speclab.eval`,
`speclab.sweeps`, `speclab.configs`); see pyproject.toml. Importing it has no side
effects: the process-wide MKL choice is made where work starts
(speculator/target/cpu_gemm.py).
"""

__version__ = "0.1.0"
