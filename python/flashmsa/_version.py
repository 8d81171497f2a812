# The one place the version is written: pyproject.toml reads it (scikit-build-core's regex metadata
# provider) and so does CMake's project(VERSION) (CMakeLists.txt).
__version__ = "0.1.0"
