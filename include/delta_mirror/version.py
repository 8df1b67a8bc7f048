"""The package version and the engine name written into ``commitInfo.engineInfo``."""

__version__ = "0.1.0"
ENGINE_INFO = f"delta-mirror/{__version__}"

__all__ = ["ENGINE_INFO", "__version__"]
